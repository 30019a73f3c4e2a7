from medusa.tree.build import build_tree_choices, default_tree_choices, expected_tokens_per_step
from medusa.tree.draft_tree import DraftTreeShape, is_draft_tree_file
from medusa.tree.tree import MedusaTree, TreeError


def default_tree(num_heads: int, num_nodes: int = 64) -> MedusaTree:
    """The built-in ~64-node tree for checkpoints that have not been calibrated yet."""
    return MedusaTree.from_choices(default_tree_choices(num_heads, num_nodes), num_heads=num_heads)


__all__ = ["DraftTreeShape", "MedusaTree", "TreeError", "build_tree_choices", "default_tree",
           "default_tree_choices", "expected_tokens_per_step", "is_draft_tree_file"]
