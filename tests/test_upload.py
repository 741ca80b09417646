"""`w12 upload` (issue 8): plan, model card, and the real huggingface_hub client against a local fake Hub.

No network: the fake Hub is a stdlib HTTP server on 127.0.0.1 (started per test, shut down after it,
and at the latest after 60 s), answering the endpoints huggingface_hub 2.x calls for create_repo +
upload_folder with Xet disabled, and recording every request.
"""

import base64
import json
import shutil
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

TOKEN = "hf_w12TestTokenDoNotPrint0123456789"
BASE = "test-org/tiny-llama-bf16"


# --------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(BF16 folder, W12 folder) of a tiny random LlamaForCausalLM."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from w12.convert.convert import convert

    root = tmp_path_factory.mktemp("tiny")
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=2, vocab_size=256)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(root / "bf16")
    convert(str(root / "bf16"), str(root / "w12"))
    return root / "bf16", root / "w12"


@pytest.fixture
def w12dir(tiny, tmp_path):
    """A private copy of the W12 folder that a test may change."""
    return Path(shutil.copytree(tiny[1], tmp_path / "tiny-w12"))


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """Online mode for loopback, Xet off (plain 'regular' uploads), a token in HF_TOKEN, no saved login."""
    from huggingface_hub import constants

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    # huggingface_hub reads these once, at import: patch the module constants it consults per call.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-saved-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-stored-tokens"))


class FakeHub:
    """Answers create-repo (409 with a url when the repo exists), create-branch, validate-yaml,
    preupload ('regular' for every file) and commit (NDJSON); records every request."""

    def __init__(self, lifetime_s: float = 60.0):
        self.requests: list[dict] = []
        self.repos: set[str] = set()
        self.fail: dict[str, int] = {}  # path -> HTTP status to answer instead
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _send(self, code: int, obj) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                hub.requests.append({"method": "GET", "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": b""})
                self._send(404, {"error": f"fake hub: no GET {self.path}"})

            def do_POST(self):
                body = self._body()
                hub.requests.append({"method": "POST", "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                base = f"http://127.0.0.1:{hub.port}"
                if self.path in hub.fail:
                    return self._send(hub.fail[self.path], {"error": "Invalid credentials in Authorization header"})
                parts = self.path.split("?")[0].strip("/").split("/")
                if self.path == "/api/repos/create":
                    req = json.loads(body)
                    repo = f"{req.get('organization') or 'fake-user'}/{req['name']}"
                    if repo in hub.repos:
                        return self._send(409, {"error": "You already created this model repo", "url": f"{base}/{repo}"})
                    hub.repos.add(repo)
                    return self._send(200, {"url": f"{base}/{repo}", "name": repo})
                if self.path == "/api/validate-yaml":
                    return self._send(200, {"errors": [], "warnings": []})
                if len(parts) >= 5 and parts[:2] == ["api", "models"]:
                    repo, action = f"{parts[2]}/{parts[3]}", parts[4]
                    if repo not in hub.repos:
                        return self._send(404, {"error": "Repository not found"})
                    if action == "preupload":
                        files = json.loads(body)["files"]
                        return self._send(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                           "shouldIgnore": False} for f in files]})
                    if action == "branch":
                        return self._send(200, {})
                    if action == "commit":
                        return self._send(200, {"commitUrl": f"{base}/{repo}/commit/{'ab' * 20}",
                                                "commitOid": "ab" * 20})
                return self._send(404, {"error": f"fake hub: no POST {self.path}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.timer = threading.Timer(lifetime_s, self.server.shutdown)
        self.timer.daemon = True

    def __enter__(self):
        self.thread.start()
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def paths(self) -> list[str]:
        return [r["path"] for r in self.requests]

    def commits(self) -> list[tuple[str, dict, dict]]:
        """(path, header value, {path_in_repo: bytes}) of each commit request."""
        out = []
        for r in self.requests:
            if "/commit/" in r["path"]:
                lines = [json.loads(line) for line in r["body"].decode().splitlines() if line.strip()]
                header = next(x["value"] for x in lines if x["key"] == "header")
                files = {x["value"]["path"]: base64.b64decode(x["value"]["content"]) for x in lines
                         if x["key"] == "file"}
                out.append((r["path"], header, files))
        return out


@pytest.fixture
def fake_hub(hub_env):
    with FakeHub() as hub:
        yield hub


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cli(*args):
    from w12.cli_upload import upload

    return CliRunner().invoke(upload, [str(a) for a in args], catch_exceptions=False)


def card_of(text: str):
    from huggingface_hub import ModelCard

    card = ModelCard(text)
    assert text.startswith("---\n")
    yaml.safe_load(text.split("---\n")[1])  # the metadata block is plain YAML
    return card


# --------------------------------------------------------------------------------------------- offline


def test_model_card_metadata_and_body(tiny):
    from w12.convert.checkpoint import inspect
    from w12.convert.hub import model_card

    config = json.loads((tiny[1] / "config.json").read_text())
    stats = {k: v for k, v in inspect(tiny[1]).items() if k != "tensors"}
    text = model_card("me/tiny-w12", config, stats, "f" * 64, base_model=BASE)
    card = card_of(text)
    d = card.data.to_dict()
    assert d["base_model"] == BASE and d["base_model_relation"] == "quantized"
    assert d["library_name"] == "transformers" and d["pipeline_tag"] == "text-generation"
    assert {"w12", "lossless", "bf16", "12-bit"} <= set(d["tags"])
    body = card.text
    for needle in ("bit for bit", "pip install w12", "w12.patch_transformers()",
                   'AutoModelForCausalLM.from_pretrained("me/tiny-w12")', "--quantization w12",
                   "w12-tensor-sha256", "f" * 64, f"{stats['bits_per_weight']:.4f}", f"{stats['escape_rate']:.3e}"):
        assert needle in body, needle
    assert model_card("me/tiny-w12", config, stats, "f" * 64, base_model=BASE) == text  # deterministic

    # no base model: no base_model / relation; encoders get feature-extraction and AutoModel
    enc = dict(config, architectures=["BertModel"], model_type="bert")
    d2 = card_of(model_card("me/enc", enc, stats, "0" * 64)).data.to_dict()
    assert "base_model" not in d2 and "base_model_relation" not in d2
    assert d2["pipeline_tag"] == "feature-extraction" and "bert" in d2["tags"]


def test_guess_base_model():
    from w12.convert.hub import guess_base_model, pipeline_for

    snap = "/home/u/.cache/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M/snapshots/" + "3" * 40
    assert guess_base_model({}, {"source": snap}) == ("HuggingFaceTB/SmolLM2-135M", "conversion source", "3" * 40)
    assert guess_base_model({"_name_or_path": "org/model"}, {"source": "/data/x"})[:2] == \
        ("org/model", "config _name_or_path")
    for local in ("/data/llama", "./llama", "~/m/llama", "C:\\m\\llama", "a/b/c", "llama", "org/bad--name", None):
        assert guess_base_model({"_name_or_path": local}, None) == (None, None, None), local
    assert pipeline_for({"architectures": ["Qwen2ForCausalLM"]}) == ("text-generation", "AutoModelForCausalLM")
    assert pipeline_for({"architectures": ["T5ForConditionalGeneration"]})[0] is None


def test_plan_upload(tiny, w12dir):
    from w12.convert.hub import plan_upload, tensor_digest

    before = sorted(p.name for p in w12dir.iterdir())
    plan = plan_upload(w12dir, "me/tiny-w12", base_model=BASE)
    assert [f.path for f in plan.files] == ["README.md", "config.json", "generation_config.json", "model.safetensors"]
    assert plan.ignored == ["w12_convert.json"]  # local conversion state stays local
    assert plan.card == "generated" and plan.base_model == BASE and plan.base_model_source == "option"
    assert plan.pipeline_tag == "text-generation"
    # the digest identifies the original BF16 tensors: the BF16 checkpoint gives the same value
    assert plan.digest == tensor_digest(tiny[0]) == tensor_digest(w12dir)
    assert plan.digest in plan.card_text
    assert plan.total_bytes == sum((w12dir / f.path).stat().st_size for f in plan.files[1:]) + \
        len(plan.card_text.encode())
    assert sorted(p.name for p in w12dir.iterdir()) == before  # nothing written into the folder
    json.dumps(plan.to_dict())

    (w12dir / "README.md").write_text("---\nlicense: mit\n---\n# mine\n")
    plan = plan_upload(w12dir, "me/tiny-w12")
    assert plan.card == "user" and plan.card_text is None and plan.base_model is None


def test_dry_run_sends_nothing(fake_hub, w12dir):
    r = cli(w12dir, "me/tiny-w12", "--dry-run", "--endpoint", fake_hub.url, "--base-model", BASE)
    assert r.exit_code == 0, r.output
    assert "would upload 4 files" in r.output and "base_model_relation: quantized" in r.output
    assert fake_hub.requests == []


# --------------------------------------------------------------------------------------------- fake Hub


def test_upload_to_fake_hub(fake_hub, w12dir):
    before = sorted(p.name for p in w12dir.iterdir())
    r = cli(w12dir, "me/tiny-w12", "--endpoint", fake_hub.url, "--base-model", BASE, "--private",
            "--commit-message", "first upload")
    assert r.exit_code == 0, r.output
    assert TOKEN not in r.output
    assert "verified: 21 tensors" in r.output and f"{fake_hub.url}/me/tiny-w12" in r.output

    paths = fake_hub.paths()
    assert paths[0] == "/api/repos/create" and "/api/validate-yaml" in paths
    assert paths[-1] == "/api/models/me/tiny-w12/commit/main"
    create = json.loads(fake_hub.requests[0]["body"])
    assert create["name"] == "tiny-w12" and create["organization"] == "me"
    assert create.get("visibility") == "private" or create.get("private") is True
    assert all(req["headers"].get("authorization") == f"Bearer {TOKEN}" for req in fake_hub.requests)

    (path, header, files), = fake_hub.commits()
    assert header["summary"] == "first upload" and "w12-tensor-sha256" in header["description"]
    assert sorted(files) == ["README.md", "config.json", "generation_config.json", "model.safetensors"]
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        assert files[name] == (w12dir / name).read_bytes(), name
    card = card_of(files["README.md"].decode())
    d = card.data.to_dict()
    assert d["base_model"] == BASE and d["base_model_relation"] == "quantized"
    assert d["pipeline_tag"] == "text-generation" and d["library_name"] == "transformers"
    assert {"w12", "lossless", "bf16", "12-bit"} <= set(d["tags"])
    assert "me/tiny-w12" in card.text and "bit for bit" in card.text
    assert sorted(p.name for p in w12dir.iterdir()) == before  # card not written into the user's folder


def test_upload_existing_repo_to_branch_keeps_user_readme(fake_hub, w12dir):
    readme = "---\nlicense: mit\ntags:\n- mine\n---\n\n# My own card\n"
    (w12dir / "README.md").write_text(readme)
    fake_hub.repos.add("me/tiny-w12")  # exists already: create answers 409 with a url
    r = cli(w12dir, "me/tiny-w12", "--endpoint", fake_hub.url, "--revision", "dev", "--token", TOKEN)
    assert r.exit_code == 0, r.output
    assert "keeping your README.md" in r.output
    assert "/api/models/me/tiny-w12/branch/dev" in fake_hub.paths()
    (path, header, files), = fake_hub.commits()
    assert path == "/api/models/me/tiny-w12/commit/dev"
    assert files["README.md"].decode() == readme
    assert (w12dir / "README.md").read_text() == readme


def test_unverified_folder_is_not_uploaded(fake_hub, w12dir):
    f = w12dir / "model.safetensors"
    raw = bytearray(f.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    start = 8 + n + header["model.layers.0.mlp.up_proj.weight"]["data_offsets"][0]
    raw[start + 100] ^= 0x01  # one view byte of one weight
    f.write_bytes(bytes(raw))
    r = cli(w12dir, "me/tiny-w12", "--endpoint", fake_hub.url)
    assert r.exit_code == 2, r.output
    assert "error:" in r.output and "w12 verify" in r.output and "model.layers.0.mlp.up_proj.weight" in r.output
    assert fake_hub.requests == []


@pytest.mark.parametrize("repo_id", ["me/bad--name", "a/b/c", "me/-x", "me/with space", "x" * 97, "me/repo.git"])
def test_bad_repo_id(fake_hub, w12dir, repo_id):
    r = cli(w12dir, repo_id, "--endpoint", fake_hub.url)
    assert r.exit_code == 2, r.output
    assert "error: invalid repo id" in r.output
    assert fake_hub.requests == []


def test_bad_base_model(fake_hub, w12dir):
    r = cli(w12dir, "me/x", "--endpoint", fake_hub.url, "--base-model", "not a repo")
    assert r.exit_code == 2 and "--base-model" in r.output
    assert fake_hub.requests == []


def test_no_network(hub_env, w12dir):
    r = cli(w12dir, "me/tiny-w12", "--endpoint", f"http://127.0.0.1:{closed_port()}")
    assert r.exit_code == 2, r.output
    assert "error: cannot reach the Hugging Face Hub" in r.output
    assert TOKEN not in r.output


def test_offline_mode_and_no_token(fake_hub, w12dir, monkeypatch):
    from huggingface_hub import constants
    import huggingface_hub.utils

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    r = cli(w12dir, "me/tiny-w12", "--endpoint", fake_hub.url)
    assert r.exit_code == 2 and "HF_HUB_OFFLINE" in r.output
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(huggingface_hub.utils, "get_token", lambda: None)
    r = cli(w12dir, "me/tiny-w12", "--endpoint", fake_hub.url)
    assert r.exit_code == 2 and "not logged in" in r.output
    assert fake_hub.requests == []


def test_not_a_w12_folder(fake_hub, tiny):
    r = cli(tiny[0], "me/tiny-w12", "--endpoint", fake_hub.url)
    assert r.exit_code == 2 and "not a W12 checkpoint" in r.output
    assert fake_hub.requests == []


def test_repo_without_namespace_and_rejected_token(fake_hub, w12dir):
    r = cli(w12dir, "tiny-w12", "--endpoint", fake_hub.url)  # the Hub picks the namespace: the token's user
    assert r.exit_code == 0, r.output
    assert fake_hub.commits()[0][0] == "/api/models/fake-user/tiny-w12/commit/main"

    fake_hub.requests.clear()
    fake_hub.fail["/api/repos/create"] = 401
    r = cli(w12dir, "me/other", "--endpoint", fake_hub.url)
    assert r.exit_code == 2 and "rejected the token (401)" in r.output and "hf auth login" in r.output
    assert TOKEN not in r.output
    assert fake_hub.paths()[0] == "/api/repos/create" and not fake_hub.commits()  # then a repo_info GET
