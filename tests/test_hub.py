"""`regolith pull` and ``Model.load("hf://...")`` against a stand-in Hub on 127.0.0.1 (tests/hub_server.py) through
``HF_ENDPOINT``: a split model with side files downloaded into the Hub's cache, only the quantization asked
for, an interrupted download resumed, a corrupt one refused, and the loaded model generating what the local
files generate. Each run is a fresh process, as a user's is (huggingface_hub reads its environment at import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("gguf")

import regolith
from regolith import gguf_split, hub
from regolith.models import DEFAULT_MODEL, resolve_model
from tests.hub_server import StandInHub

DEMO = resolve_model(DEFAULT_MODEL)
REPO = "someorg/demo-GGUF"
PLE_TABLE = "per_layer_token_embd.weight"
PROMPT = "import os\n\ndef main():"


@pytest.fixture(scope="module")
def repo_files(tmp_path_factory) -> dict[str, bytes]:
    """The demo model as the repository's Q8_0 quantization (2 shards of ~12 MB without the PLE table and MTP
    head, and those as side files), a Q4_0 quantization's shards that must not be fetched, and a README."""
    d = tmp_path_factory.mktemp("repo")
    with regolith.gguf.open(DEMO) as src:
        head = f"blk.{src.metadata['qwen4exp.block_count'] - 1}."
        mtp = [n for n in src.tensors if n.startswith(head)]
        rest = [n for n in src.tensors if n != PLE_TABLE and n not in mtp]
        gguf_split.write_split(src, d / "demo-Q8_0.gguf", max_tensors=len(rest) // 2 + 1, tensors=rest)
        gguf_split.write_merged(src, d / "ple-Q8_0.gguf", tensors=[PLE_TABLE], metadata=False)
        gguf_split.write_merged(src, d / "mtp-Q8_0.gguf", tensors=mtp, metadata=False)
    files = {p.name: p.read_bytes() for p in sorted(d.glob("*.gguf"))}
    assert len(files) == 4
    files |= {f"demo-Q4_0-0000{i}-of-00002.gguf": bytes(100) for i in (1, 2)}
    return files | {"README.md": b"# demo\n"}


def _regolith(hub_url: str, cache: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env |= {
        "HF_ENDPOINT": hub_url,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join(sys.path),  # the regolith this test process imports
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _pull(hub_url: str, cache: Path, spec: str) -> subprocess.CompletedProcess:
    return _regolith(
        hub_url, cache, f"import sys; from regolith.cli import main; sys.exit(main(['pull', {spec!r}]))"
    )


def _gets(server: StandInHub) -> list[str]:
    return [p.rsplit("/", 1)[-1] for m, p, _ in server.requests if m == "GET" and "/resolve/" in p]


def test_pull_fetches_the_quantization_resuming_a_cut_download(repo_files, tmp_path):
    cache = tmp_path / "cache"
    cut = "demo-Q8_0-00001-of-00002.gguf"  # 14.5 MB
    with StandInHub({REPO: repo_files}) as server:
        server.cut.add(cut)
        run = _pull(server.url, cache, f"{REPO}:q8_0")
        assert run.returncode == 0, run.stderr
        fetched = _gets(server)
        assert sorted(set(fetched)) == sorted(n for n in repo_files if "Q8_0" in n)
        ranges = [r for m, p, r in server.requests if m == "GET" and p.endswith(cut)]
        # the second request resumed from what the first had written (huggingface_hub writes whole 10 MiB chunks)
        assert len(ranges) == 2 and ranges[0] is None
        assert ranges[1].startswith("bytes=") and 0 < int(ranges[1][6:-1]) < len(repo_files[cut]) - 65536
        first = Path(run.stdout.strip().splitlines()[-1])
        assert first.name == "demo-Q8_0-00001-of-00002.gguf" and cache in first.parents
        for name in fetched:
            assert (first.parent / name).read_bytes() == repo_files[name]
        assert not list(cache.rglob("*.incomplete"))
        server.requests.clear()
        again = _pull(server.url, cache, f"{REPO}:Q8_0")
        assert again.returncode == 0, again.stderr
        assert _gets(server) == []  # everything was cached
        url = server.url
    offline = _pull(url, cache, f"{REPO}:Q8_0")  # the Hub is gone: the cached snapshot serves
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout.strip().splitlines()[-1] == str(first)
    assert _pull(url, cache, f"{REPO}:Q4_0").returncode == 2  # not cached, and no Hub to fetch it from


def test_hf_uri_loads_and_generates_like_the_local_model(repo_files, tmp_path):
    expect = regolith.Model.load(DEMO, n_ctx=128).generate(PROMPT, 24, temperature=0)
    code = (
        "import regolith\n"
        f"m = regolith.Model.load('hf://{REPO}:Q8_0', n_ctx=128)\n"
        "print(m.files.ple.name, m.files.mtp.name)\n"
        f"print(repr(m.generate({PROMPT!r}, 24, temperature=0)))\n"
    )
    with StandInHub({REPO: repo_files}) as server:
        run = _regolith(server.url, tmp_path / "cache", code)
    assert run.returncode == 0, run.stderr
    names, text = run.stdout.strip().splitlines()[-2:]
    assert names == "ple-Q8_0.gguf mtp-Q8_0.gguf"
    assert text == repr(expect)


def test_corrupt_download_is_refused_and_removed(repo_files, tmp_path):
    cache = tmp_path / "cache"
    with StandInHub({REPO: repo_files}) as server:
        server.corrupt.add("ple-Q8_0.gguf")
        run = _pull(server.url, cache, REPO + ":Q8_0")
        assert run.returncode == 2
        assert "ple-Q8_0.gguf: downloaded sha256" in run.stderr and "removed" in run.stderr
        assert not [p for p in cache.rglob("ple-Q8_0.gguf")]
        good = set(repo_files.values())
        assert all(
            p.read_bytes() in good for p in cache.rglob("blobs/*") if p.is_file()
        )  # no corrupt blob kept
        server.corrupt.clear()
        run = _pull(server.url, cache, REPO + ":Q8_0")
        assert run.returncode == 0, run.stderr


def test_refusals_name_what_is_wrong(repo_files, tmp_path):
    with StandInHub({REPO: repo_files}) as server:
        run = _pull(server.url, tmp_path / "c", REPO + ":Q5_K")
        assert (
            run.returncode == 2
            and "has no model for 'Q5_K'; it has: demo-Q4_0-00001-of-00002.gguf" in run.stderr
        )
        run = _pull(server.url, tmp_path / "c", "someorg/missing")
        assert run.returncode == 2 and "cannot read someorg/missing on the Hub" in run.stderr
        full_disk = (
            "import regolith.hub as h\nh._free_bytes = lambda d: 10**6\n"
            f"try:\n    h.pull({REPO!r}, 'Q8_0')\nexcept regolith.HubError as e:\n    print(e)\n"
        )
        run = _regolith(server.url, tmp_path / "c", "import regolith\n" + full_disk)
        assert "files of 0.03 GB to download, 0.00 GB free" in run.stdout, run.stderr
        assert _gets(server) == []


def test_repo_spec_and_default_quantization():
    assert hub.parse_repo("hf://a/b:Q4_K_M") == ("a/b", "Q4_K_M")
    assert hub.parse_repo("a/b") == ("a/b", None)
    assert hub.parse_repo("./a/b") is None and hub.parse_repo("a/b/c") is None
    assert hub.parse_repo("models/m.gguf") is None and hub.parse_repo("hf://a/m.gguf") == ("a/m.gguf", None)
    sets = {"m-Q4_K_M": ["m-Q4_K_M.gguf"], "m-Q4_K_M_L": ["m-Q4_K_M_L.gguf"], "m-Q8_0": ["m-Q8_0.gguf"]}
    assert hub._choose(sets, None, "model", "r", True) == ["m-Q4_K_M.gguf"]  # llama.cpp's -hf default
    assert hub._choose(sets, "q8_0", "model", "r", True) == ["m-Q8_0.gguf"]
    with pytest.raises(regolith.HubError, match="several mmproj files"):
        hub._choose({"a": ["mmproj-f16.gguf"], "b": ["mmproj-bf16.gguf"]}, None, "mmproj file", "r", False)
