"""The CLI's answers to bad input: out-of-range values and an empty prompt (one clear line, exit 2, before any
model loads), unknown chat commands and unwritable /save paths, a --ctx past the trained context (a warning)."""

import io

import pytest
from rich.console import Console

import regolith
from regolith import cli, cli_options, terminal


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "-5"], "argument -n/--max-tokens: must be >= 0, got -5"),
        (["--temp", "-1"], "argument --temp: must be >= 0, got -1"),
        (["--temp", "nan"], "argument --temp: must be a finite number, got nan"),
        (["--top-p", "5"], "argument --top-p: must be in (0, 1], got 5"),
        (["--top-p", "0"], "argument --top-p: must be in (0, 1], got 0"),
        (["--min-p", "1.5"], "argument --min-p: must be in [0, 1], got 1.5"),
        (["--top-k", "-2"], "argument --top-k: must be >= 0, got -2"),
        (["--repeat-penalty", "0"], "argument --repeat-penalty: must be > 0, got 0"),
        (["--seed", "-1"], "argument --seed: must be in [0, 18446744073709551616), got -1"),
        (["--seed", str(2**64)], f"argument --seed: must be in [0, 18446744073709551616), got {2**64}"),
        (["--ctx", "0"], "argument --ctx: must be > 0, got 0"),
        (["--arena-gb", "inf"], "argument --arena-gb: must be a finite number, got inf"),
        (["--top-p", "x"], "argument --top-p: invalid float value: 'x'"),
        (
            ["--kv-type", "q4_0"],
            "argument --kv-type: invalid choice: 'q4_0' (choose from 'f32', 'f16', 'q8_0', 'i8')",
        ),
    ],
)
@pytest.mark.parametrize("command", ["run", "chat"])
def test_out_of_range_value_is_a_usage_error(command, args, message, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_load", lambda *a: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, *args] + (["-p", "x"] if command == "run" else []))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("usage: regolith " + command)
    assert err[-1] == f"regolith {command}: error: {message}"


@pytest.mark.parametrize("value", ["1", "0.5", "1e-3"])
def test_in_range_values_parse(value):
    args = cli._parser().parse_args(["run", "--top-p", value, "--min-p", "0", "--temp", "0", "-n", "0"])
    assert args.top_p == float(value) and args.min_p == 0 and args.temp == 0 and args.max_tokens == 0


def test_empty_prompt_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_load", lambda *a: pytest.fail("a model was loaded"))
    assert cli.main(["run", "-p", ""]) == 2
    assert capsys.readouterr().err == "error: the prompt is empty: give it with -p TEXT or on stdin\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert cli.main(["run"]) == 2
    assert capsys.readouterr().err == "error: the prompt is empty: give it with -p TEXT or on stdin\n"


def test_chat_commands_unknown_and_failed_save(tmp_path, scripted_input, capsys):
    (tmp_path / "a-file").write_text("")
    unwritable = tmp_path / "a-file" / "chat.json"  # its directory is a file
    script = scripted_input(
        [
            "/frobnicate",
            "/save",
            "/save " + str(unwritable),
            "/usr/bin holds programs",  # a path, not a command: sent to the model
            "/exit",
            "never read",
        ]
    )
    assert cli.main(["chat", "-n", "1", "--temp", "0", "-q"]) == 0
    out = capsys.readouterr().out
    assert "unknown command /frobnicate" in out and "commands: /reset" in out
    assert "usage: /save PATH" in out
    assert "error: File exists: " + str(tmp_path / "a-file") in out.replace("\n", "")
    assert "unknown command /usr" not in out
    assert next(script) == "never read"  # /exit ended the chat


def test_ctx_beyond_the_trained_context_warns(capsys):
    trained = regolith.Model.load().config["context_length"]
    assert cli.main(["run", "-p", "x", "-n", "1", "--temp", "0", "-q", "--ctx", str(trained)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert cli.main(["run", "-p", "x", "-n", "1", "--temp", "0", "-q", "--ctx", str(2 * trained)]) == 0
    err = capsys.readouterr().err
    assert f"warning: --ctx {2 * trained} is more than the {trained} tokens the model was trained on" in err


def _words(text: str) -> list[str]:
    return text.replace("|", " ").replace(",", " ").split()


def test_reports_fit_the_terminal():
    model = regolith.Model.load(arena_gb=0.004)
    gen = model.generate("class Stack:", max_tokens=8, temperature=0, stream=True)
    "".join(gen)
    stats = model.stats()  # one snapshot: the arena's I/O threads may still finish prefetches
    model.stats = lambda: stats
    for width in (80, 60, 200):
        out = io.StringIO()
        console = Console(file=out, width=width)
        terminal.report(gen, console)
        terminal.report_arena(model, console)
        lines = out.getvalue().splitlines()
        assert all(len(line) <= width for line in lines)
        assert width < 200 or len(lines) == 2  # each report on one line where it fits
        wide = io.StringIO()
        terminal.report(gen, Console(file=wide, width=1000))
        terminal.report_arena(model, Console(file=wide, width=1000))
        assert _words(out.getvalue()) == _words(wide.getvalue())  # only the line breaks differ
    plan = model.plan.render()
    for width in (80, 70):
        narrow = model.plan.render(width=width)
        assert all(len(line) <= width for line in narrow.splitlines())
        assert narrow.split() == plan.split()
    assert model.plan.render(width=1000) == plan


def test_prefill_progress_reports_each_chunk():
    from regolith.generation import PREFILL_CHUNK

    model = regolith.Model.load()
    ids = model.tokenize("def f(x):\n    return x + 1\n" * 200)[: 2 * PREFILL_CHUNK + 100]
    calls = []
    model.generate(
        ids, max_tokens=1, temperature=0, on_prefill=lambda done, total: calls.append((done, total))
    )
    n = len(ids)
    assert calls == [(PREFILL_CHUNK, n), (2 * PREFILL_CHUNK, n), (n, n)]
    # The window holds the prompt, but the last token's logits are needed again and qwen4exp's recurrent state
    # cannot go back one token: the prompt is evaluated again from its start, and reported so.
    first = list(calls)
    calls.clear()
    model.generate(
        ids, max_tokens=1, temperature=0, on_prefill=lambda done, total: calls.append((done, total))
    )
    assert calls == first


def test_prefill_bar_only_for_long_prompts():
    console = Console(file=io.StringIO(), width=80)
    bar = terminal.PrefillBar(console)
    bar(512, 1000)
    assert bar.progress is None  # two chunks or fewer: no bar
    bar(512, 1500)
    assert bar.progress is not None
    bar(1500, 1500)
    assert bar.progress is None  # done: the bar is gone
    bar(512, 1500)
    bar.close()  # cancelled part-way: close() takes it down
    assert bar.progress is None


def test_bench_prints_one_table(capsys):
    assert cli.main(["bench", "-p", "32", "-n", "4", "-r", "2", "--arena-gb", "0.004"]) == 0
    out = capsys.readouterr().out
    for row in (
        "prefill (pp32)",
        "decode (tg4)",
        "arena hit rate",
        "disk reads",
        "peak memory (RSS)",
        "repetitions",
    ):
        assert row in out
    assert out.count("tok/s") == 2 and "±" in out  # two repetitions: a spread
    assert "device" not in out  # the host's CPU: no device row
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "-p", "0"])
    assert exit_.value.code == 2


def test_bench_names_the_device_of_a_gpu_backend(capsys):
    assert cli.main(["bench", "-p", "8", "-n", "1", "-r", "1", "--backend", "metal-emu"]) == 0
    assert "a Metal GPU emulated on the CPU" in capsys.readouterr().out


def test_kv_type_reaches_the_model(capsys):
    assert (
        cli.main(
            ["run", "-p", "class Stack:", "-n", "3", "--temp", "0", "-q", "--spec", "off", "--kv-type", "i8"]
        )
        == 0
    )
    ref = regolith.Model.load(kv_type="i8").generate("class Stack:", max_tokens=3, temperature=0)
    assert ref and ref in capsys.readouterr().out
    args = cli._parser().parse_args(["serve", "--kv-type", "q8_0"])
    assert cli_options.memory_options(args)["kv_type"] == "q8_0"


def test_serve_scr_reaches_the_model():
    from rich.console import Console

    for argv, scr in (
        (["serve", "--arena-gb", "0.004"], False),
        (["serve", "--arena-gb", "0.004", "--scr"], True),
    ):
        model, _ = cli._server(cli._parser().parse_args(argv), Console(stderr=True))
        assert model.scr is scr


def test_serve_ray_without_ray_installed_says_what_to_install(capsys, monkeypatch):
    import sys

    import regolith.server

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails, as where it is not installed
    monkeypatch.delitem(sys.modules, "regolith.server.ray", raising=False)
    monkeypatch.delattr(regolith.server, "ray", raising=False)  # where an earlier test imported it
    assert cli.main(["serve", "--ray"]) == 2
    err = capsys.readouterr().err
    assert "--ray needs Ray Serve" in err and "pip install 'regolith[ray]'" in err
