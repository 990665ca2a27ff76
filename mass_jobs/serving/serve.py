"""The embedded OpenAI-compatible model server: `transformers serve`, plus the few things it lacks.

`ModelServer(model_dir)` runs `mass serve` as a child process on 127.0.0.1 (a free port), waits for
`/health`, exposes `.endpoint` (a `mass_jobs.serving.llm.Endpoint`), and stops the process group on exit:

    with ModelServer(model_dir, served_name="tiny") as srv:
        client = ModelClient(srv.endpoint, sampling)

The app is transformers' own (`transformers.cli.serving`): chat completions streaming and not,
`<think>` -> `reasoning_content` and `<tool_call>` -> `tool_calls` through its response parser
(picked by `model_type`, so any Qwen3 checkpoint and the tiny model parse the same way), and
`GET /health`. `MassChatHandler` adds only what it lacks; see its docstring.

Run: `mass serve --model DIR [--port P] [--host 127.0.0.1] [--served-name NAME]`
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mass_jobs.serving.llm import Endpoint
from mass_jobs.serving.prefix_cache import DEFAULT_BUDGET_GIB, PrefixCache
from mass_jobs.serving.prefix_cache import install as install_prefix_cache
from mass_jobs.serving.request_checks import EXTRA_SAMPLING, invalid_request_reason
from mass_jobs.serving.server_process import ServerProcess


def make_chat_handler_class():
    from fastapi import HTTPException
    from transformers.cli.serving.chat_completion import ChatCompletionHandler

    class MassChatHandler(ChatCompletionHandler):
        """transformers' chat handler with these additions, each missing upstream (5.24):

        - malformed bodies get a 400 naming the field (upstream: 500 from a KeyError/TypeError);
        - integer `logit_bias` values work (upstream: 500, its processor accepts only floats);
        - the model answers to `served_name` (upstream only accepts the path it was started with);
        - `top_k`, `min_p`, `repetition_penalty` are honoured (upstream rejects them with 422);
        - assistant `reasoning_content` in the history reaches the chat template (upstream drops
          it), so the prompt matches how training renders multi-step tool use;
        - a request's `temperature` decides sampling (> 0) or greedy decoding (0), whatever the
          model's generation config says (upstream keeps its `do_sample`, greedy when it has none);
        - `seed` seeds torch on the inference thread right before that request's generate()
          (upstream seeds when the request arrives, so concurrent requests share one RNG stream
          and the same seeded request gives different text depending on what else is running);
        - the KV state of prompt prefixes is reused across requests (`prefix_cache`), replies unchanged.
        """

        served_name: str = ""
        prefix_cache = None  # a PrefixCache, set by build_app

        def _validate_request(self, body: dict) -> None:
            reason = invalid_request_reason(body)
            if reason:
                raise HTTPException(status_code=400, detail=reason)
            super()._validate_request({k: v for k, v in body.items() if k not in EXTRA_SAMPLING})

        def _resolve_model(self, body: dict):
            requested = body.get("model")
            if requested not in (None, "", self.served_name, self.model_manager.force_model):
                raise HTTPException(
                    status_code=404, detail=f"model {requested!r} not served here; use {self.served_name!r}"
                )
            body["model"] = None
            _model_id, model, processor = super()._resolve_model(body)
            _seed_per_request(model)
            if self.prefix_cache is not None:
                install_prefix_cache(model, self.prefix_cache)
            return self.served_name, model, processor

        def _build_generation_config(self, body: dict, model_generation_config, use_cb: bool = False):
            if body.get("logit_bias"):  # upstream passes JSON ints on; its logits processor demands floats (500)
                body["logit_bias"] = {k: float(v) for k, v in body["logit_bias"].items()}
            config = super()._build_generation_config(
                {k: v for k, v in body.items() if k != "seed"}, model_generation_config, use_cb=use_cb
            )
            config.mass_seed = body.get("seed")  # read by _seed_per_request's generate()
            if body.get("temperature") is not None:
                # The request decides: a model whose generation_config.json lacks do_sample (most
                # converted or older checkpoints) would otherwise decode greedily whatever it asked.
                config.do_sample = float(body["temperature"]) > 0
            for key, kind in EXTRA_SAMPLING.items():
                if body.get(key) is not None:
                    setattr(config, key, kind(body[key]))
            return config

        def get_processor_inputs_from_messages(self, messages: list[dict], modality) -> list[dict]:
            converted = ChatCompletionHandler.get_processor_inputs_from_messages(messages, modality)
            for original, out in zip(messages, converted):
                if original.get("role") == "assistant" and isinstance(original.get("reasoning_content"), str):
                    out["reasoning_content"] = original["reasoning_content"]
            return converted

        async def handle_request(self, body: dict, request_id: str):
            import jinja2

            try:
                return await super().handle_request(body, request_id)
            except jinja2.TemplateError as exc:  # e.g. the template's raise_exception on a bad turn order
                raise HTTPException(status_code=400, detail=f"chat template rejected the messages: {exc}") from exc

    return MassChatHandler


def _seed_per_request(model) -> None:
    """Wrap model.generate once so a request's seed is applied on the inference thread, which runs
    one generate() at a time: the seeded text no longer depends on concurrent requests."""
    if getattr(model, "_mass_seeded_generate", False):
        return
    import torch

    upstream = model.generate

    def generate(*args, generation_config=None, **kwargs):
        seed = getattr(generation_config, "mass_seed", None)
        if seed is not None:
            torch.manual_seed(seed)
        return upstream(*args, generation_config=generation_config, **kwargs)

    model.generate = generate
    model._mass_seeded_generate = True


def control_tokens(tokenizer, template) -> tuple[str, ...]:
    """The tokenizer's special tokens that are not markup of the response template: turn and
    padding markers such as `<|im_end|>`, which a client must never see. `<think>` or `<tool_call>`
    stay when the template parses them (they reach a client only inside unparseable model text)."""
    specials = set(getattr(tokenizer, "all_special_tokens", []))
    specials |= {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
    markup = json.dumps(template.get("fields", template)) if template else ""  # not start_anchor
    return tuple(sorted((t for t in specials if t and t not in markup), key=len, reverse=True))


def strip_tokens(text: str | None, tokens: tuple[str, ...]) -> str | None:
    if not text:
        return text
    for tok in tokens:
        text = text.replace(tok, "")
    return text


class TokenFilter:
    """Removes `tokens` from a stream of text pieces, also when one arrives split across pieces:
    a tail that may be the start of a token is held back until the next piece decides."""

    def __init__(self, tokens: tuple[str, ...]):
        self.tokens, self.held = tokens, ""

    def feed(self, text: str) -> str:
        text = strip_tokens(self.held + text, self.tokens)
        keep = max((n for tok in self.tokens for n in range(1, len(tok)) if text.endswith(tok[:n])), default=0)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        text, self.held = self.held, ""
        return text


class _TolerantStream:
    """A streaming response parser that, once the model's tool-call region fails to parse as JSON,
    passes the rest of the text through as plain content instead of raising into generate(); and
    that never lets a control token (`control_tokens`) out in content or reasoning text."""

    def __init__(self, parser, tokens: tuple[str, ...] = ()):
        self._parser, self._broken = parser, False
        self.initial_events = parser.initial_events
        self._tokens, self._filters = tokens, {}

    def _clean(self, events: list[dict]) -> list[dict]:
        out = []
        for ev in events:
            if ev.get("type") == "region_chunk" and not ev.get("dirty") and ev.get("text"):
                flt = self._filters.setdefault(ev.get("field"), TokenFilter(self._tokens))
                ev = {**ev, "text": flt.feed(ev["text"])}
                if not ev["text"]:
                    continue
            out.append(ev)
        return out

    def feed(self, text: str) -> list[dict]:
        if not self._broken:
            try:
                return self._clean(self._parser.feed(text))
            except ValueError:
                self._broken = True
        return self._clean([{"type": "region_chunk", "field": "content", "text": text}])

    def finalize(self):
        msg, events = ({}, []) if self._broken else self._parser.finalize()
        # held-back text that never became a whole token goes out before the final events
        tail = [
            {"type": "region_chunk", "field": f, "text": t} for f, flt in self._filters.items() if (t := flt.flush())
        ]
        return msg, tail + self._clean(events)


def _tolerate_malformed_tool_calls() -> None:
    """Upstream answers HTTP 500 when the model writes a <tool_call> whose body is not JSON (its parser
    raises). A model's malformed call is model output, not a server fault: like vLLM's tool parsers,
    hand it back as plain content with no tool_calls, so the harness can tell the model and go on."""
    from transformers.cli.serving import chat_completion
    from transformers.cli.serving.utils import get_response_template

    if getattr(chat_completion, "_mass_tolerant", False):
        return
    parse, build = chat_completion.parse_assistant_message, chat_completion.build_response_parser

    def tokens_of(processor, model) -> tuple[str, ...]:
        tokenizer = getattr(processor, "tokenizer", processor)
        return control_tokens(tokenizer, get_response_template(processor, model))

    def parse_assistant_message(processor, model, generated_ids, input_ids, cleaned_content="", tools=None):
        tokens = tokens_of(processor, model)
        try:
            content, reasoning, calls = parse(
                processor, model, generated_ids, input_ids=input_ids, cleaned_content=cleaned_content, tools=tools
            )
        except ValueError:
            tokenizer = getattr(processor, "tokenizer", processor)
            ids = generated_ids.tolist() if hasattr(generated_ids, "tolist") else list(generated_ids)
            text = tokenizer.decode(ids, skip_special_tokens=False)
            for end in ("<|im_end|>", "<|endoftext|>"):
                text = text.split(end)[0]
            content, reasoning, calls = text, None, None
        return strip_tokens(content, tokens), strip_tokens(reasoning, tokens), calls

    def build_response_parser(processor, model, input_ids, tools=None):
        parser = build(processor, model, input_ids, tools=tools)
        return None if parser is None else _TolerantStream(parser, tokens_of(processor, model))

    chat_completion.parse_assistant_message = parse_assistant_message
    chat_completion.build_response_parser = build_response_parser
    chat_completion._mass_tolerant = True


def text_model_manager(base):
    """transformers' model manager, loading every checkpoint as its causal LM with its tokenizer. Agent
    episodes are text: a multimodal checkpoint (the paper's Qwen3.6 wraps its text model with a vision
    tower) is served without the tower, and its image and video processors (which need torchvision)
    are never loaded. A text checkpoint loads as before."""

    class TextModelManager(base):
        def _load_processor(self, model_id_and_revision, gguf_file=None):
            from transformers import AutoTokenizer
            from transformers.cli.serving.utils import split_revision

            model_id, revision = split_revision(model_id_and_revision)
            return AutoTokenizer.from_pretrained(
                model_id, revision=revision, gguf_file=gguf_file, trust_remote_code=self.trust_remote_code
            )

        def _load_model(self, model_id_and_revision, tqdm_class=None, progress_callback=None, gguf_file=None):
            from transformers import AutoModelForCausalLM
            from transformers.cli.serving.utils import split_revision

            model_id, revision = split_revision(model_id_and_revision)
            kwargs = {
                "revision": revision,
                "attn_implementation": self.attn_implementation,
                "dtype": self.dtype,
                "device_map": self.device,
                "trust_remote_code": self.trust_remote_code,
                "tqdm_class": tqdm_class,
                "gguf_file": gguf_file,
            }
            quantization = self.get_quantization_config()
            if quantization is not None:
                kwargs["quantization_config"] = quantization
            return AutoModelForCausalLM.from_pretrained(model_id, **{k: v for k, v in kwargs.items() if v is not None})

    return TextModelManager


def build_app(
    model_dir,
    served_name: str,
    device: str = "auto",
    dtype: str = "auto",
    continuous_batching: bool = False,
    prefix_cache_gib: float = DEFAULT_BUDGET_GIB,
):
    """The FastAPI app: transformers' server wired as `transformers serve MODEL` wires it, with our
    chat handler. Loads the model before returning, so `/health` is only up once it can answer.

    `prefix_cache_gib` bounds the KV state of prompt prefixes kept for reuse (0: none kept; the
    prefill is cut at the same block boundaries either way, so replies are the same). `GET
    /prefix_cache` answers its counters: prompt tokens seen, reused and prefilled.

    `continuous_batching` is upstream's `--continuous-batching`: concurrent requests share forward
    passes (paged attention), but the sampling settings of the first request hold for all of them
    and a request's `seed` is not applied, so it is off by default (docs/running.md, "Serving")."""
    from transformers.cli.serving.completion import CompletionHandler
    from transformers.cli.serving.model_manager import ModelManager
    from transformers.cli.serving.response import ResponseHandler
    from transformers.cli.serving.server import build_server
    from transformers.cli.serving.systemone import SystemOneHandler
    from transformers.cli.serving.transcription import TranscriptionHandler
    from transformers.cli.serving.utils import GenerationState

    _tolerate_malformed_tool_calls()
    manager = text_model_manager(ModelManager)(
        device=device, dtype=dtype, force_model=str(model_dir), continuous_batching=continuous_batching
    )
    state = GenerationState(continuous_batching=continuous_batching)
    chat = make_chat_handler_class()(model_manager=manager, generation_state=state)
    chat.served_name = served_name
    cache = PrefixCache(int(prefix_cache_gib * 2**30))
    chat.prefix_cache = cache
    app = build_server(
        manager,
        chat,
        completion_handler=CompletionHandler(model_manager=manager, generation_state=state),
        response_handler=ResponseHandler(model_manager=manager, generation_state=state),
        transcription_handler=TranscriptionHandler(manager, state),
        systemone_handler=SystemOneHandler(model_manager=manager, generation_state=state),
        generation_state=state,
    )
    _own_routes(app, served_name, cache)
    return app


def _own_routes(app, served_name: str, cache: PrefixCache) -> None:
    """/v1/models under the served name, and /prefix_cache's counters."""
    from fastapi.responses import JSONResponse

    # Upstream lists the model under its load path; clients should see the name they must send.
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) != "/v1/models"]

    @app.get("/v1/models")
    def list_models():
        return JSONResponse(
            {"object": "list", "data": [{"id": served_name, "object": "model", "owned_by": "local", "created": 0}]}
        )

    @app.get("/prefix_cache")
    def prefix_cache_stats():
        return JSONResponse(
            {
                **cache.stats.as_dict(),
                "entries": len(cache.entries),
                "bytes": cache.bytes,
                "budget_bytes": cache.budget_bytes,
                "block": cache.block,
            }
        )


def default_served_name(location) -> str:
    return Path(str(location).rstrip("/")).name or "model"


class ModelServer(ServerProcess):
    """`mass serve` as a child process for the duration of a `with` block."""

    def __init__(
        self,
        model_dir,
        port: int | None = None,
        served_name: str | None = None,
        *,
        host: str = "127.0.0.1",
        device: str = "auto",
        dtype: str = "auto",
        continuous_batching: bool = False,
        prefix_cache_gib: float = DEFAULT_BUDGET_GIB,
        startup_timeout_s: float = 180.0,
        log_path: str | os.PathLike | None = None,
    ):
        super().__init__(
            host=host, port=port, name="model server", startup_timeout_s=startup_timeout_s, log_path=log_path
        )
        self.model_dir = str(model_dir)
        self.served_name = served_name or default_served_name(model_dir)
        self.device, self.dtype = device, dtype
        self.continuous_batching = continuous_batching
        self.prefix_cache_gib = prefix_cache_gib

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "mass_jobs.commands.cli", "serve", "--model", self.model_dir, "--host", self.host,
            "--port", str(self.port), "--served-name", self.served_name, "--device", self.device, "--dtype", self.dtype,
            "--prefix-cache-gib", str(self.prefix_cache_gib),
            *(["--continuous-batching"] if self.continuous_batching else []),
        ]  # fmt: skip

    @property
    def endpoint(self):

        return Endpoint(base_url=f"{self.base_url}/v1", model=self.served_name)
