"""Self-distillation: the base model answers prompts and its own replies become the training data.

``self_distill(SelfDistillConfig(...))`` is the library entry point; ``medusa self-distill`` the command.
"""

from medusa.selfdistill.backends.base import EndpointUnreachable, Request, Result, Sampling
from medusa.selfdistill.modes import MODES
from medusa.selfdistill.prompts import Prompt, PromptOptions, load_prompts
from medusa.selfdistill.run import SelfDistillConfig, self_distill
from medusa.selfdistill.writer import ResumableWriter, errors_path

__all__ = [
           "MODES",
           "EndpointUnreachable",
           "Prompt",
           "PromptOptions",
           "Request",
           "Result",
           "ResumableWriter",
           "Sampling",
           "SelfDistillConfig",
           "errors_path",
           "load_prompts",
           "self_distill",
]
