"""The embedded default model: a tiny trained Llama shipped with the package, the same bytes
everywhere.

Why shipped and not built: CPU training is reproducible per machine, not across CPU families
(shared/ENGINE_NOTES.md: the same recipe gave a different model on an Intel machine with AVX-512,
which answered random prompts with "OK OK OK ..."). So the weights trained once by
``build_tiny.py`` (the recipe, kept for provenance) ship in ``tiny_llama/`` beside this file, and
every file's SHA256 is pinned in :data:`PINNED_SHA256`. :func:`ensure_embedded_model` verifies
them before every use; a mismatch is a :class:`~pleharness.errors.HarnessError` that says
what to do. :func:`model_digest` is what the manifest records (``engine.model_digest``).

``ple-harness build-model --verify`` retrains from the recipe with the engine's Python and compares
the result with the pinned weights (identical only on a machine like the one that built them; the
answer is informative, the shipped weights stay authoritative).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import HarnessError

BUILD_SCRIPT = Path(__file__).with_name("build_tiny.py")
SHIPPED_DIR = Path(__file__).with_name("tiny_llama")
SERVED_NAME = "ple-tiny-llama"
WEIGHTS_FILE = "model.safetensors"
# SHA256 of every file of the shipped model (pinned; verified before every use).
PINNED_SHA256 = {
    "chat_template.jinja":
        "ade865a531ed6c5b5576a02df481c95af87b4bccab632f86cb3d39c5b1682508",
    "config.json":
        "24ac336b160e01fb7c50246bdcaedb162408f429024783b87cd6476a0af9b473",
    "generation_config.json":
        "4a265e095fcf1a7df979dd0bd23974935cefdcd51141f363aad58903b9da9643",
    "model.safetensors":
        "0085570ec27c3db4c7c93741c02330b092e8e3836135fb978217fead047f0bbb",
    "ple_harness_model.json":
        "79df0974c085d9bfaaf35796da8c7f0cb259f667b5f9663384dbb6ae3fc1ccbb",
    "tokenizer.json":
        "73a22f78de9f73847841e727702409f57db3532d7e63bab8067480a603315988",
    "tokenizer_config.json":
        "a732a1ef85a95492f82d7786c6ed9ff50ecbc95cb72db582cf74217068455b89",
}
WEIGHTS_SHA256 = PINNED_SHA256.get(WEIGHTS_FILE, "")


def sha256_file(path: Path) -> str:
    """Lowercase hex SHA256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_embedded_model(folder: Path = SHIPPED_DIR) -> None:
    """Check every pinned file of the embedded model folder against :data:`PINNED_SHA256`.

    Raises HarnessError naming the first missing or changed file and what to do.
    """
    for name, want in sorted(PINNED_SHA256.items()):
        p = Path(folder) / name
        if not p.is_file():
            raise HarnessError(f"embedded model: {p} is missing; reinstall ple-harness (or "
                               "`git checkout -- pleharness/model/tiny_llama` in a clone)")
        got = sha256_file(p)
        if got != want:
            raise HarnessError(
                f"embedded model: {p} has SHA256 {got[:16]}..., the pinned value is "
                f"{want[:16]}...: the file was changed (a Git LFS pointer or a partial copy?). "
                "Reinstall ple-harness or restore the file from the repository; verdicts on "
                "another model are not comparable with anyone else's")


def ensure_embedded_model(python: str | None = None, log=print) -> Path:
    """Path of the embedded model folder, after verifying every file's pinned SHA256.

    ``python`` and ``log`` are accepted for compatibility (nothing is built any more).
    Raises HarnessError on a mismatch (see :func:`verify_embedded_model`).
    """
    verify_embedded_model(SHIPPED_DIR)
    return SHIPPED_DIR


def model_digest(model_path: str | Path) -> dict:
    """What the manifest records about the served model's identity.

    The embedded model: ``{"kind": "embedded", "weights_sha256": ..., "verified": True}``.
    Another local folder: a cheap fingerprint (SHA256 of config.json, and the weight files' names
    and sizes; hashing hundreds of GB of weights per run would cost minutes):
    ``{"kind": "fingerprint", "config_sha256": ..., "weight_files": {name: bytes}}``.
    A path that is no local folder (a hub id): ``{"kind": "unknown", "model": path}``.
    """
    p = Path(model_path)
    try:
        if p.resolve() == SHIPPED_DIR.resolve():
            return {"kind": "embedded", "weights_sha256": WEIGHTS_SHA256, "verified": True}
    except OSError:
        pass
    if not (p / "config.json").is_file():
        return {"kind": "unknown", "model": str(model_path)}
    files = {f.name: f.stat().st_size for f in sorted(p.iterdir())
             if f.suffix in (".safetensors", ".bin", ".gguf", ".pt") and f.is_file()}
    return {"kind": "fingerprint", "config_sha256": sha256_file(p / "config.json"),
            "weight_files": files}


def rebuild(python: str | None = None, log=print) -> dict:
    """Retrain the embedded model from ``build_tiny.py`` (about 5 minutes on 2 cores) into a
    temporary folder and compare it with the pinned files.

    Returns {"same": bool, "weights_sha256": rebuilt digest, "pinned_sha256": ...,
    "differing_files": [...], "selfcheck": {...}}. Raises HarnessError when the build fails.
    """
    tmp = Path(tempfile.mkdtemp(prefix="ple-tiny-rebuild-"))
    try:
        log(f"rebuilding the embedded model from {BUILD_SCRIPT.name} (a few minutes) ...")
        r = subprocess.run([python or sys.executable, str(BUILD_SCRIPT), str(tmp / "m")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])
            raise HarnessError(f"building the embedded model failed (exit {r.returncode}):\n{tail}")
        got = {n: sha256_file(tmp / "m" / n) for n in PINNED_SHA256 if (tmp / "m" / n).is_file()}
        differing = sorted(n for n, h in PINNED_SHA256.items()
                           if got.get(n) != h and n != "ple_harness_model.json")
        meta = json.loads((tmp / "m" / "ple_harness_model.json").read_text())
        return {"same": not differing, "weights_sha256": got.get(WEIGHTS_FILE),
                "pinned_sha256": WEIGHTS_SHA256, "differing_files": differing,
                "selfcheck": meta.get("selfcheck")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
