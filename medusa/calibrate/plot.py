"""Pictures of a calibration: accuracy by head and rank (heatmap), and the tree itself (PNG, Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(accuracy: Sequence[Sequence[float]], path: str | Path, title: str = "") -> Path:
    """Heatmap of ``accuracy[k][r]`` (rows: heads 1..K, columns: ranks 0..topk-1), values written in."""
    plt = pyplot()
    rows, cols = len(accuracy), len(accuracy[0]) if accuracy else 0
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * cols, 1.0 + 0.5 * rows), dpi=120)
    image = ax.imshow([list(r) for r in accuracy], cmap="viridis", vmin=0.0, vmax=max(
        (max(r) for r in accuracy if len(r)), default=1.0) or 1.0, aspect="auto")
    for k in range(rows):
        for r in range(cols):
            value = accuracy[k][r]
            ax.text(r, k, f"{value:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if value < 0.5 * image.norm.vmax else "black")
    ax.set_xticks(range(cols), [str(r) for r in range(cols)])
    ax.set_yticks(range(rows), [f"head {k + 1}" for k in range(rows)])
    ax.set_xlabel("rank in the head's top-k")
    ax.set_title(title or "P(head k's rank-r token is the right one)", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_tree(choices: Sequence[Sequence[int]], path: str | Path,
              weights: dict[tuple[int, ...], float] | None = None, title: str = "") -> Path:
    """Draw the tree: depth left to right, leaves stacked top to bottom, each node labelled with its rank.

    ``weights``: optional per-path acceptance probability, shown as the node colour.
    """
    plt = pyplot()
    paths = [()] + sorted((tuple(c) for c in choices), key=lambda p: (len(p), p))
    children: dict[tuple[int, ...], list[tuple[int, ...]]] = {p: [] for p in paths}
    for p in paths[1:]:
        children[p[:-1]].append(p)
    y: dict[tuple[int, ...], float] = {}
    next_leaf = [0.0]

    def place(p: tuple[int, ...]) -> float:  # leaves: consecutive rows; parents: their children's mean
        kids = sorted(children[p])
        if not kids:
            y[p] = next_leaf[0]
            next_leaf[0] += 1
        else:
            y[p] = sum(place(c) for c in kids) / len(kids)
        return y[p]

    place(())
    depth = max(len(p) for p in paths)
    fig, ax = plt.subplots(figsize=(1.5 + 1.6 * depth, 1.0 + 0.22 * next_leaf[0]), dpi=120)
    for p in paths[1:]:
        ax.plot([len(p) - 1, len(p)], [y[p[:-1]], y[p]], color="0.6", linewidth=0.8, zorder=1)
    colors = [(weights or {}).get(p, 1.0 if not p else 0.0) for p in paths]
    ax.scatter([len(p) for p in paths], [y[p] for p in paths], c=colors, cmap="viridis", vmin=0, vmax=1,
               s=90, zorder=2, edgecolors="black", linewidths=0.4)
    for p in paths:
        ax.text(len(p), y[p], "root" if not p else str(p[-1]), ha="center", va="center", fontsize=6,
                color="white", zorder=3)
    ax.set_xticks(range(depth + 1), ["root"] + [f"head {d}" for d in range(1, depth + 1)])
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_title(title or f"tree: {len(paths)} nodes, depth {depth}", fontsize=9)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
