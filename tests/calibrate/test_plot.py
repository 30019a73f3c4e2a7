"""medusa.calibrate.plot: the Agg backend, and the accuracy heatmap and the tree drawing written as PNGs.
(The plots through the command: tests/cli/test_calibrate.py.)"""

from medusa.calibrate.plot import plot_accuracy, plot_tree, pyplot

PNG = b"\x89PNG\r\n\x1a\n"


def test_pyplot_draws_off_screen():
    plt = pyplot()
    assert plt.get_backend().lower() == "agg"


def test_plot_accuracy_writes_a_png(tmp_path):
    accuracy = [[0.7, 0.1, 0.05], [0.5, 0.1, 0.0]]  # [K=2 heads][topk=3 ranks]
    path = plot_accuracy(accuracy, tmp_path / "acc.png", title="heads")
    assert path == tmp_path / "acc.png" and path.read_bytes()[:8] == PNG
    zero = plot_accuracy([[0.0, 0.0]], tmp_path / "zero.png")  # all zero: the colour scale still works
    assert zero.read_bytes()[:8] == PNG


def test_plot_tree_writes_a_png(tmp_path):
    choices = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    weights = {(0,): 0.7, (1,): 0.1, (0, 0): 0.4, (0, 1): 0.05, (0, 0, 0): 0.2}
    path = plot_tree(choices, tmp_path / "tree.png", weights=weights)
    assert path == tmp_path / "tree.png" and path.read_bytes()[:8] == PNG
    assert plot_tree([], tmp_path / "root.png").read_bytes()[:8] == PNG  # the root alone
