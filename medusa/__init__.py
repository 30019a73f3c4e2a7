"""medusa: train, calibrate, export and decode with MEDUSA heads on any Hugging Face causal LM."""

from medusa.errors import CheckpointError, ConfigError, DataError, MedusaError
from medusa.modeling import MedusaConfig, MedusaHeads, MedusaModel, MedusaOutput, ResBlock
from medusa.tree import MedusaTree

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "ConfigError", "DataError", "MedusaConfig", "MedusaError", "MedusaHeads",
    "MedusaModel", "MedusaOutput", "MedusaTree", "ResBlock", "__version__",
]
