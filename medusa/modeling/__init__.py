from medusa.modeling.config import MedusaConfig
from medusa.modeling.forward import MedusaOutput
from medusa.modeling.heads import MedusaHeads, ResBlock
from medusa.modeling.model import MedusaModel

__all__ = ["MedusaConfig", "MedusaHeads", "MedusaModel", "MedusaOutput", "ResBlock"]
