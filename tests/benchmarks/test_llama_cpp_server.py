"""benchmarks.llama_cpp_server without a server: the command line of each config, and the drafter's
running totals read from a log (the last statistics line)."""

from pathlib import Path

from benchmarks.llama_cpp_server import ServerConfig, per_position, server_argv

LOG = """srv  log_server_r: done request: POST /completion 127.0.0.1 200
slot print_timing: id  0 | task 0 | draft acceptance = 0.16260 (   20 accepted /   123 generated)
statistics     draft-eagle3: #calls(b,g,a) =    1     41     41, #gen drafts =     41, #acc drafts =    15, \
#gen tokens =    123, #acc tokens =    20, #mean acc len = 1.49, #acc rate/pos = (0.366, 0.098, 0.024)
statistics     draft-eagle3: #calls(b,g,a) =    2     79     79, #gen drafts =     79, #acc drafts =    30, \
#gen tokens =    232, #acc tokens =    45, #mean acc len = 1.57, #acc rate/pos = (0.392, 0.139, 0.038)
"""


def test_server_argv_plain_ngram_and_eagle3():
    binary, model = Path("/x/llama-server"), Path("t.gguf")
    plain = server_argv(binary, model, ServerConfig("plain"), 8080)
    assert plain[:3] == ["/x/llama-server", "-m", "t.gguf"] and "--spec-type" not in plain
    assert plain[plain.index("-t") + 1] == "1" and plain[plain.index("--host") + 1] == "127.0.0.1"
    ngram = server_argv(binary, model, ServerConfig("ngram-mod", "ngram-mod", draft_n_max=None), 8080)
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-mod" and "--spec-draft-n-max" not in ngram
    eagle = server_argv(binary, model, ServerConfig("e", "draft-eagle3", Path("d.gguf"), 4), 8080)
    assert eagle[eagle.index("-md") + 1] == "d.gguf" and eagle[eagle.index("--spec-draft-n-max") + 1] == "4"
    assert eagle[eagle.index("--spec-draft-p-min") + 1] == "0" and eagle[eagle.index("-td") + 1] == "1"
    early = server_argv(binary, model, ServerConfig("e", "draft-eagle3", Path("d.gguf"), 4, p_min=0.7), 8080)
    assert early[early.index("--spec-draft-p-min") + 1] == "0.7"


def test_per_position_reads_the_last_totals():
    got = per_position(LOG)
    assert got == {"impl": "draft-eagle3", "steps": 79, "per_position": [0.392, 0.139, 0.038]}
    assert per_position("no statistics here") is None
