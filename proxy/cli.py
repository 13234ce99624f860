"""`tracefleet proxy`: run the capture proxy in front of an engine."""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

from pydantic import ValidationError

from tracefleet.contract import environment, podenv
from tracefleet.contract.engine_limits import (CONNECT_FLAG, FIRST_TOKEN_FLAG, INTER_TOKEN_FLAG, LOGPROBS_MODE_FLAG,
                                               LOGPROBS_MODES, TOTAL_FLAG, EngineLimits)
from tracefleet.contract.podenv import PodEnvError, ProxySidecarEnv
from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.contract.sampling import TEMPERATURE_FLAG, TOP_K_FLAG, TOP_P_FLAG, SamplingOverride

ENGINE_API_KEY_ENV = podenv.ENGINE_API_KEY


def engine_api_key(path: Path | None) -> str | None:
    """The engine key from --engine-api-key-file (a mounted Secret), else $TRACEFLEET_ENGINE_API_KEY."""
    if path is not None:
        return path.read_text().strip() or None
    return os.environ.get(ENGINE_API_KEY_ENV) or None


def engine_version_problem(engine_url: str, api_key: str | None, timeout_s: float = 5.0) -> str | None:
    """Why the engine cannot be used, when it is up and a vLLM below the minimum; None otherwise (also when
    it is not up yet: a sidecar proxy may start before its engine, which is then checked on first use)."""
    import asyncio

    from tracefleet.contract.engine_limits import EngineLimits
    from tracefleet.proxy.engine_client import EngineClient, unsupported_engine_version
    from tracefleet.proxy.errors import ProxyError

    async def check() -> str | None:
        client = EngineClient(engine_url, limits=EngineLimits(connect_s=timeout_s, first_token_s=timeout_s),
                              api_key=api_key)
        try:
            return unsupported_engine_version(await client.version())
        except ProxyError:
            return None
        finally:
            await client.aclose()

    return asyncio.run(check())


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def add_engine_arguments(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The engine time limits and the logprobs kind, as `tracefleet proxy` takes them and `tracefleet run` passes
    them on (with defaults=False: unset flags leave the job's spec.inference as it is)."""
    d = EngineLimits()

    def default(value: float) -> str:
        return f"default {value:g}" if defaults else f"default: spec.inference.engineTimeouts, else {value:g}"

    parser.add_argument(CONNECT_FLAG, type=positive_seconds, metavar="S", default=d.connect_s if defaults else None,
                        help=f"limit on opening a connection to the engine ({default(d.connect_s)})")
    parser.add_argument(FIRST_TOKEN_FLAG, type=positive_seconds, metavar="S",
                        default=d.first_token_s if defaults else None,
                        help="limit from sending a call to the engine to its first token; a non-streamed engine answer "
                             f"arrives whole, so it bounds all of it ({default(d.first_token_s)})")
    parser.add_argument(INTER_TOKEN_FLAG, type=positive_seconds, metavar="S",
                        default=d.inter_token_s if defaults else None,
                        help="limit between two tokens of a streamed answer: an engine that stalls this long is cut "
                             f"off, what it produced recorded ({default(d.inter_token_s)})")
    parser.add_argument(TOTAL_FLAG, type=positive_seconds, metavar="S", default=None,
                        help="limit on a whole call (default: none; a call still producing tokens is not cut for time)")
    parser.add_argument(LOGPROBS_MODE_FLAG, choices=LOGPROBS_MODES, default=None,
                        help="what kind of logprobs the engine reports (vLLM --logprobs-mode), recorded with every "
                             "call: "
                             "processed_logprobs (after temperature/top-k/top-p: behaviour logprobs) or raw_logprobs "
                             "(vLLM's default); unset: what the engine's /v1/models card says, else 'unknown'")


def engine_limits(args: argparse.Namespace) -> EngineLimits:
    return EngineLimits(connect_s=args.engine_connect_timeout_s, first_token_s=args.engine_first_token_timeout_s,
                        inter_token_s=args.engine_inter_token_timeout_s, total_s=args.engine_total_timeout_s)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the tracefleet capture proxy. Harnesses (Codex, Claude Code, Qwen Code, Pi, Gemini CLI, OpenCode, ...) "
        "call it as if it were their provider; it forwards every call to ENGINE (a vLLM OpenAI-compatible server or "
        "`tracefleet engine`) and records prompt/sampled token ids and logprobs per session under CAPTURE_DIR. "
        "Create a session with `POST /admin/sessions` (Authorization: Bearer ADMIN_TOKEN); the harness then uses the "
        "returned secret as its API key, optionally with base URL http://HOST:PORT/s/<session_id>."
    )
    parser.epilog = (
        "example: tracefleet proxy --engine http://127.0.0.1:8000 --capture-dir ./capture --admin-token $TOKEN --port 4000\n"
        "         curl -XPOST -H 'authorization: Bearer '$TOKEN localhost:4000/admin/sessions"
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--engine", metavar="URL", help="engine base URL, e.g. http://127.0.0.1:8000 (no /v1); required "
                        "unless --in-pod")
    parser.add_argument("--in-pod", action="store_true",
                        help="a harness pod's sidecar: the job's settings and the session come whole from the pod's plan "
                             "(tracefleet.contract.podenv.ProxySidecarEnv, as the operator writes it), not from flags")
    parser.add_argument("--capture-dir", required=True, type=Path, metavar="DIR", help="where <session_id>.jsonl capture logs go")
    parser.add_argument("--admin-token", default=os.environ.get(environment.ADMIN_TOKEN), metavar="T",
                        help="bearer token for /admin/* (default: $TRACEFLEET_ADMIN_TOKEN; sidecar mode with --session and "
                        "no token: a random one, the admin API stays closed)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=4000, help="port (0 = pick a free one; default 4000)")
    parser.add_argument("--port-file", type=Path, metavar="FILE", help="write the bound port here once listening")
    parser.add_argument("--mode", choices=["auto", "server", "exact"], default="auto",
                        help="capture mode: 'exact' = the proxy renders with the model's own chat template, reuses the "
                             "exact ids it served for the history and sends token ids to the engine (refuses to start "
                             "when it cannot read the tokenizer); 'server' = the engine renders prompts and returns "
                             "token ids; 'auto' (default) = exact where the model's family is supported, server "
                             "otherwise (the choice and its reason are printed, on /health and in the metrics)")
    parser.add_argument("--model-path", metavar="REF",
                        help="exact mode: a shipped model name (smollm2, gemma3-270m), a .gguf file, a Hugging Face "
                             "model directory (tokenizer.json + tokenizer_config.json) or a hub id already in the local "
                             "Hugging Face cache ($HF_HOME/hub, e.g. a mounted vLLM model cache); default: --served-model, else "
                             "the model the engine's /v1/models names (its root, then its id)")
    parser.add_argument("--model-family", metavar="NAME", help="exact mode: override the detected model family")
    parser.add_argument("--tool-parser", metavar="NAME", help="exact mode: override the tool-call output parser")
    parser.add_argument("--served-model", metavar="NAME", help="engine model name (default: first from the engine's /v1/models)")
    parser.add_argument("--session", action="append", default=[], metavar="ID:SECRET",
                        help="create this session at startup (sidecar mode); repeatable")
    parser.add_argument("--max-body-mb", type=float, default=32.0, help="reject larger requests with 413 (default 32)")
    parser.add_argument("--keepalive-s", type=float, default=10.0, help="ping the harness after this much engine silence")
    parser.add_argument("--pause-max-wait-s", type=float, default=30.0, help="while paused, calls wait this long, then 429")
    parser.add_argument("--engine-api-key-file", type=Path, metavar="FILE",
                        help="send the key in FILE as 'Authorization: Bearer' to the engine (vLLM --api-key); "
                             f"default: ${ENGINE_API_KEY_ENV} when set")
    add_engine_arguments(parser, defaults=True)
    parser.add_argument(TEMPERATURE_FLAG, type=float, default=None, metavar="T",
                        help="sample every call at T, whatever the harness asks (a job's spec.inference.sampling; "
                             "recorded with source 'job'); default: the harness's, else the engine's")
    parser.add_argument(TOP_P_FLAG, type=float, default=None, metavar="P", help="top_p for every call, as --temperature")
    parser.add_argument(TOP_K_FLAG, type=int, default=None, metavar="K",
                        help="top_k for every call, as --temperature (-1: no cutoff)")
    parser.add_argument("--policy-version", type=int, default=0, help="initial policy version recorded on calls")
    parser.add_argument("--guide", metavar="URL",
                        help="an engine that answers the first calls of a session created with guided_calls N (a "
                             "demonstration's turns, recorded guided: context, never trained on); exact mode only")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    parser.add_argument("--upload-to", metavar="PREFIX",
                        help="when the proxy stops (SIGTERM, as a pod sidecar), upload each --session's capture log as "
                        "PREFIX/capture.jsonl and the files under --artifacts-dir as PREFIX/artifacts/...; PREFIX is "
                        "s3://BUCKET/PREFIX/ (credentials from the AWS_* env) or a directory")
    parser.add_argument("--artifacts-dir", type=Path, default=Path("/artifacts"), metavar="DIR",
                        help="the harness's artifacts folder uploaded with --upload-to (default /artifacts; skipped if absent)")


def _planned(args: argparse.Namespace) -> tuple[ProxyPlan, list[str], str | None]:
    """(the proxy's plan, its --session ID:SECRET arguments, where it uploads): in a pod, whole from the pod's plan and
    its secret variable; else from the flags. ValueError or PodEnvError: one line saying what is wrong."""
    if args.in_pod:
        if args.engine or args.session or args.upload_to or args.guide:
            raise ValueError("--in-pod takes the engine, the session and the upload folder from the pod's plan, and "
                             "a pod's session is never guided: drop --engine, --session, --upload-to and --guide")
        pod = ProxySidecarEnv.from_env()
        return pod.plan.proxy, [f"{pod.plan.session_id}:{pod.session_secret}"], pod.plan.upload_to
    if not args.engine:
        raise ValueError("--engine URL is required (or --in-pod, in a harness pod)")
    try:
        plan = ProxyPlan(engine_url=args.engine, mode=args.mode, served_model=args.served_model,
                         tokenizer=args.model_path, model_family=args.model_family, tool_parser=args.tool_parser,
                         engine_limits=engine_limits(args), logprobs_mode=args.logprobs_mode,
                         sampling=SamplingOverride(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k),
                         policy_version=args.policy_version)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise ValueError(f"--{str(error['loc'][-1]).replace('_', '-')}: {error['msg']}") from None
    return plan, args.session, args.upload_to


def main(args: argparse.Namespace) -> int:
    from tracefleet.sockets import listening_socket, write_port_file

    from tracefleet.proxy.app import create_app
    from tracefleet.proxy.config import PresetSession, ProxyConfig
    from tracefleet.proxy.server import proxy_server

    try:
        plan, session_args, upload_to = _planned(args)
    except (PodEnvError, ValueError) as exc:
        print(f"tracefleet proxy: {exc}")
        return 2
    args.session = session_args
    if not args.admin_token and args.session:
        # Sidecar mode: its sessions are given on the command line; nobody needs the admin API, so it
        # gets a token no one knows instead of being open.
        import secrets

        args.admin_token = secrets.token_urlsafe(32)
    if not args.admin_token:
        print("tracefleet proxy: --admin-token (or TRACEFLEET_ADMIN_TOKEN) is required")
        return 2
    sessions = []
    for spec in args.session:
        sid, sep, secret = spec.partition(":")
        if not sep or not sid or len(secret) < 16:
            print(f"tracefleet proxy: --session {spec!r}: expected ID:SECRET with a secret of 16+ characters")
            return 2
        sessions.append(PresetSession(session_id=sid, secret=secret))
    try:
        key = engine_api_key(args.engine_api_key_file)
    except OSError as exc:
        print(f"tracefleet proxy: --engine-api-key-file: {exc}")
        return 2
    problem = engine_version_problem(plan.engine_url, key)
    if problem:
        print(f"tracefleet proxy: {problem}", flush=True)
        return 2
    config = ProxyConfig.from_plan(
        plan, engine_api_key=key, capture_dir=args.capture_dir, admin_token=args.admin_token,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024), keepalive_s=args.keepalive_s,
        pause_max_wait_s=args.pause_max_wait_s, sessions=sessions, upload_to=upload_to, artifacts_dir=args.artifacts_dir,
        guide_url=args.guide,
    )
    try:
        app = create_app(config)
    except ValueError as exc:  # exact mode asked for but impossible, an unknown family, ...
        print(f"tracefleet proxy: {exc}", flush=True)
        return 2
    decision = app.state.proxy.mode_decision
    print(f"tracefleet proxy: capture mode {decision.mode} ({decision.reason})", flush=True)
    # proxy_headers off: nothing here reads the client's address, so X-Forwarded-* rewriting per call buys nothing
    server = proxy_server(app, log_level=args.log_level, access_log=False, timeout_keep_alive=75, proxy_headers=False)
    sock = listening_socket(args.host, args.port, server.config.backlog)  # before the port file names it
    port = sock.getsockname()[1]
    if args.port_file:
        write_port_file(args.port_file, port)
    print(f"tracefleet proxy listening on http://{args.host}:{port} -> engine {plan.engine_url}, capture {args.capture_dir}",
          flush=True)
    # What start-up built (FastAPI, pydantic schemas, the tokenizer) lives as long as the process:
    # frozen out of the collector, so periodic full collections stop walking it on the call path
    gc.collect()
    gc.freeze()
    if config.upload_to:
        from tracefleet.proxy.upload import serve_then_upload

        return serve_then_upload(server, [sock], prefix=config.upload_to, capture_dir=config.capture_dir,
                                 session_ids=[s.session_id for s in sessions], artifacts_dir=config.artifacts_dir)
    server.run(sockets=[sock])
    return 0
