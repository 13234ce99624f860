"""A session in a container of its task's image: the session program's place for Harbor tasks on this machine.

Everything but the harness process is the host's (`HostPlace`: the in-process proxy, the session folders,
result.json, judging); the harness runs in `podman run` of the task's image (tracefleet.runner.containers.images),
and the container is kept, stopped, until the session was judged (the Harbor verifier reads its layer diff), then
removed (`finish`). The container starts before its session runs where the scheduler says which sessions come next
(`start_ahead`: its start, 0.14 s alone on these 2 cores and 0.3-0.6 s under load, is then no part of the session's
time); its forwarder waits, running nothing of the session's, until `run` writes the session's spec (argv,
environment, user, working directory) to the FIFO it reads, and only then does anything in the working directory.

What the container gets, and why:
  - the harness CLI without being baked into the image: the host's `node` mounted read-only at
    /opt/tracefleet/bin/node (first on PATH, so `#!/usr/bin/env node` finds it; a bookworm-based image shares its
    libc), the harness CLIs' cache (~/.cache/tracefleet/harnesses) read-only at the same path, so the preset's argv
    needs no rewriting; the session's HOME (the preset's config files) read-write at the same path;
  - the working directory: task.toml's [environment].workdir, else the image's WORKDIR (HarborTaskRun.workdir), also
    what the preset is told (Codex's `-C`). The agent's writes land there, inside the container, not on the host;
  - the network: task.toml's (`container_limits`: no network unless the task says "public"), and in every case the
    proxy made reachable on the container's own 127.0.0.1:<proxy port> by a small forwarder run by the mounted node
    as PID 1 (`BRIDGE_JS`; it also makes the working directory when the image names one it never created, as docker
    does and podman does not), which connects each accepted connection to a Unix socket mounted in from the host,
    where the runner's `UnixToTcpBridge` forwards it to the proxy. So the session's proxy URL is the same inside as
    outside, and without network the proxy is the only endpoint the harness can reach. (With rootful podman here,
    the bridge network of a "public" task also reaches the host's ports bound on 0.0.0.0; the unprivileged
    `unshare -rn` namespace the host sandbox uses cannot be joined by a rootful container.)
  - its cpu and memory limits: task.toml's (`container_limits`), as the cgroup of the container;
  - its user: [agent].user (a name or a number, resolved in the image by the forwarder, which then owns the session's
    HOME to it and starts the harness as it), root when the task names none, as Harbor runs agents;
  - its environment: the session program's (tracefleet.runner.environment) over task.toml's [environment].env, in
    the JSON spec written to the container's FIFO (CONTAINER_GO in the session's folder, 0600, mounted read-only),
    that the forwarder hands to the harness as its whole environment. Never on the command line (the session's secret
    would show in `ps`), in a file, or in podman's own container config (`podman inspect` would show it); and JSON,
    not podman's --env-file, whose one-line-per-variable format cannot hold a value with a newline (every Harbor
    instruction, in TRACEFLEET_PROMPT, ends with one): every value reaches the harness byte for byte.
"""

from __future__ import annotations

import contextvars
import json
import os
import shutil
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from pathlib import Path

from tracefleet.contract import layout

from tracefleet.contract.session import SessionPlan, SessionResult
from tracefleet.contract.task_image import HARBOR_EVALUATOR
from tracefleet.harbor.folders import HarborTask, load_task
from tracefleet.harbor.image_names import repository_name
from tracefleet.runner.containers.changes import (layer_diff, mount_container, mount_image, unmount_image, within,
                                                  write_change_set)
from tracefleet.runner.containers.limits import container_limits
from tracefleet.runner.containers.reaper import RUN_LABEL, Reaper
from tracefleet.runner.containers.runtime import STEPS_FILE, ContainerRuntime, record_step, timed_to
from tracefleet.runner.containers.session_record import CHANGE_SET, CONTAINER_RECORD, TOOLS_DIR, container_of
from tracefleet.runner.containers.verifier import READY_MARGIN_S, Verifier, go_ahead, hold, release, write_fifo
from tracefleet.runner.proxy_admin import ProxyAdmin
from tracefleet.runner.sandbox import ProcessResult, SandboxOptions, base_env, run_sandboxed
from tracefleet.runner.session import HostPlace, SessionFolders, harness_program
from tracefleet.runner.workspace import tree_patch

NODE_IN_CONTAINER = f"{TOOLS_DIR}/bin/node"
BRIDGE_IN_CONTAINER = f"{TOOLS_DIR}/bridge.js"
GO_IN_CONTAINER = f"{TOOLS_DIR}/go"
TIMING_IN_CONTAINER = f"{TOOLS_DIR}/timing.json"
SOCKET_IN_CONTAINER = f"{TOOLS_DIR}/proxy.sock"
CONTAINER_PATH = f"{TOOLS_DIR}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONTAINER_GO = "container-go"  # in the session's artifacts: the FIFO its container's forwarder reads the spec from
CONTAINER_TIMING = "container-timing.json"  # in the session's artifacts: when the harness started and exited inside
CONTAINER_PREFIX = "tracefleet-session-"
STOP_TIMEOUT_S = 60
DISCARD_WAIT_S = 30  # for an unused container's `podman run` to end once it is removed
DISCARD_POLL_S = 1.0
START_WAIT_S = 120  # for the container's forwarder to take the session's spec
VERIFIER_AFTER_S = 30  # the verifier starts once the harness did, or after this long

BRIDGE_JS = r"""'use strict';
// tracefleet: inside the session's container (loopback only), 127.0.0.1:PORT forwards to the Unix socket the
// runner serves (its bridge to the proxy). The container may start before its session runs: this waits for the
// session's spec ({env, argv, user, workdir}) on the FIFO GO (exiting 0 after WAIT seconds without one), then runs
// the harness in workdir (made when the image has none yet, as docker does) with exactly that environment, and exits
// with the harness's status.
const fs = require('fs');
const net = require('net');
const os = require('os');
const { spawn } = require('child_process');
const [port, socketPath, goFifo, timingFile, waitS] = process.argv.slice(2);
const timing = {};  // when the container was up, the harness started and exited (epoch ms): podman's share is the rest
const mark = (key) => { timing[key] = Date.now(); try { fs.writeFileSync(timingFile, JSON.stringify(timing)); } catch (e) {} };
const server = net.createServer((client) => {
  const upstream = net.createConnection(socketPath);
  client.pipe(upstream).pipe(client);
  const end = () => { client.destroy(); upstream.destroy(); };
  for (const s of [client, upstream]) { s.on('error', end); s.on('close', end); }
});
server.on('error', (err) => { console.error(`tracefleet bridge: ${err.message}`); process.exit(125); });
const unused = setTimeout(() => process.exit(0), Number(waitS) * 1000);
server.listen(Number(port), '127.0.0.1', () => {
  mark('up');
  const chunks = [];
  fs.createReadStream(goFifo).on('data', (c) => chunks.push(c)).on('error', (err) => {
    console.error(`tracefleet: ${goFifo}: ${err.message}`); process.exit(125);
  }).on('end', () => { clearTimeout(unused); run(JSON.parse(Buffer.concat(chunks).toString('utf8'))); });
});
function run({ env, argv, user, workdir }) {
  fs.mkdirSync(workdir, { recursive: true });
  process.chdir(workdir);
  // [agent].user (a name or a number, resolved in the image): the harness runs as it and owns its HOME
  let ids = {};
  if (user) {
    const found = fs.readFileSync('/etc/passwd', 'utf8').split('\n').map((l) => l.split(':'))
      .find((f) => f[0] === user || f[2] === user);
    if (!found && !/^[0-9]+$/.test(user)) {
      console.error(`tracefleet: [agent].user ${user}: no such user in the task image`); process.exit(125);
    }
    ids = found ? { uid: Number(found[2]), gid: Number(found[3]) } : { uid: Number(user), gid: Number(user) };
    const own = (p) => {
      fs.lchownSync(p, ids.uid, ids.gid);
      const st = fs.lstatSync(p);
      if (st.isDirectory()) for (const name of fs.readdirSync(p)) own(`${p}/${name}`);
    };
    if (env.HOME) own(env.HOME);
  }
  mark('started');
  const child = spawn(argv[0], argv.slice(1), { stdio: 'inherit', env, ...ids });
  for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => child.kill(sig));
  child.on('error', (err) => { console.error(`tracefleet: cannot start ${argv[0]}: ${err.message}`); process.exit(127); });
  child.on('exit', (code, sig) => { mark('exited'); process.exit(code === null ? 128 + (os.constants.signals[sig] || 0) : code); });
}
"""


def _record_run(container: "_Container", went: float, ended: float, rc: int | None) -> None:
    """The session's `podman run` as a step, from its go (`went`) until the client returned, split where the harness
    started and exited inside the container: `start` (the go until the harness started: for a container that was not
    started ahead, the client, image lookup, create, mounts, network, the runtime and the forwarder up too, lock waits
    included), `harness`, `stop` (the harness's exit until the client returned: teardown, cleanup, lock waits); `up`:
    the container's own start (`podman run` until the forwarder listened), `ahead` 1 when that was before the go."""
    try:
        inside = json.loads(container.timing.read_text() or "{}")
    except ValueError:
        inside = {}
    parts = {"ahead": float(container.ahead)}
    if "up" in inside:
        parts["up"] = inside["up"] / 1000 - container.launched
    if "started" in inside:
        parts["start"] = inside["started"] / 1000 - went
        if "exited" in inside:
            parts["harness"] = (inside["exited"] - inside["started"]) / 1000
            parts["stop"] = ended - inside["exited"] / 1000
    record_step("run", ended - went, rc, **{k: round(v, 4) for k, v in parts.items()})


@dataclass
class _Container:
    """A session's container, started (`podman run` in a thread: `process`), its forwarder waiting for the go."""
    name: str
    go: Path  # the FIFO the forwarder reads the session's spec from
    timing: Path
    program: Path | None  # a harness binary mounted from outside the harness cache
    launched: float  # time.time() of its `podman run`
    process: Future[ProcessResult]
    ahead: bool  # started before its session ran (start_ahead)


def runs_in_container(plan: SessionPlan) -> bool:
    """A Harbor task with its image, and not refused: its sessions run in a container of that image (this place)."""
    harbor = plan.task.harbor
    return harbor is not None and bool(harbor.image) and not harbor.refusal


def image_workdir(runtime: ContainerRuntime, image: str) -> str:
    """The image's WORKDIR ("/" when it sets none), where Harbor runs the agent and test.sh by default."""
    return runtime.run("image", "inspect", "--format", "{{.Config.WorkingDir}}", image, timeout=60).stdout.strip() or "/"


class ContainerPlace(HostPlace):
    """HostPlace, with the harness in a container of the task's image (see the module's docstring). `socket`: the
    host's Unix socket forwarding to the proxy (a `UnixToTcpBridge` the caller runs); `tools`: a folder this place
    may write its forwarder to. `start_ahead(plan)` starts a session's container before the session runs (the
    scheduler's next plans): its start is then no part of the session's time. `close` when no session runs any more
    (removes the containers started ahead that no session took, unmounts the images)."""

    def __init__(self, *, runtime: ContainerRuntime, admin: ProxyAdmin, proxy_url: str, session_root: Path,
                 socket: Path, tools: Path, stop: threading.Event | None = None) -> None:
        super().__init__(admin=admin, proxy_url=proxy_url, session_root=session_root, stop=stop)
        # every container of this run carries its label, and the reaper removes what is left of them when the run
        # ends, however it ends (SIGKILL: nothing of the run is left to do it)
        label = f"{RUN_LABEL}={uuid.uuid4().hex[:12]}"
        self.runtime = replace(runtime, run_flags=(*runtime.run_flags, "--label", label))
        self._reaper = Reaper(label, runtime.argv, runtime.env)
        self.socket = socket
        self.port = int(self.proxy_url.rsplit(":", 1)[1].split("/")[0])
        tools.mkdir(parents=True, exist_ok=True)
        self.bridge_js = tools / "bridge.js"
        self.bridge_js.write_text(BRIDGE_JS)
        self.node = Path(shutil.which("node") or "/usr/bin/node").resolve()
        self._lock = threading.Lock()
        self._ahead: dict[Path, _Container] = {}  # by the session's artifacts folder: started, not yet run
        self._images: dict[str, Future[Path]] = {}  # each image mounted once (workspace_diff), until `close`

    def harness_workdir(self, plan: SessionPlan, workspace: Path) -> Path:
        harbor = plan.task.harbor
        return Path(harbor.workdir) if harbor is not None and harbor.workdir else workspace

    def _mounts(self, home: Path, go: Path, timing: Path, program: Path | None) -> list[str]:
        from tracefleet.runner.presets.base import harness_cache_dir

        mounts = [(self.node, NODE_IN_CONTAINER, "ro"), (self.bridge_js, BRIDGE_IN_CONTAINER, "ro"),
                  (go, GO_IN_CONTAINER, "ro"), (timing, TIMING_IN_CONTAINER, "rw"),
                  (self.socket, SOCKET_IN_CONTAINER, "rw"), (home, home, "rw")]
        cache = harness_cache_dir()
        if cache.is_dir():
            mounts.append((cache, cache, "ro"))
        if program is not None:
            mounts.append((program, program, "ro"))
        return [arg for host, inside, mode in mounts for arg in ("-v", f"{host}:{inside}:{mode}")]

    def start_ahead(self, plan: SessionPlan) -> None:
        """Start the container of a session that runs soon (nothing when it is not a container's, or started)."""
        artifacts = self.folders(plan).artifacts
        if not runs_in_container(plan) or (self.stop is not None and self.stop.is_set()):
            return
        with self._lock:
            if artifacts in self._ahead:
                return
            self._ahead[artifacts] = self._start(plan, None, ahead=True)

    def _start(self, plan: SessionPlan, program: Path | None, *, ahead: bool = False) -> _Container:
        """`podman run` of the session's container, in a thread; its forwarder waits for the spec `run` writes to its FIFO."""
        harbor = plan.task.harbor
        assert harbor is not None and harbor.image, "ContainerPlace runs Harbor tasks with an image"
        folders = self.folders(plan)
        artifacts, home = folders.artifacts, folders.home
        (home / ".tmp").mkdir(parents=True, exist_ok=True)
        config = load_task(Path(harbor.folder)).config
        name = f"{CONTAINER_PREFIX}{repository_name(plan.capture_name)}-{uuid.uuid4().hex[:6]}"
        go, timing = artifacts / CONTAINER_GO, artifacts / CONTAINER_TIMING
        go.unlink(missing_ok=True)
        os.mkfifo(go, 0o600)
        timing.write_text("{}")
        wait_s = 2 * plan.harness.timeout_s + READY_MARGIN_S  # its turn (a session's length at most), then a margin
        podman = self.runtime.command(
            "run", "--name", name, *self.runtime.run_flags, *container_limits(config, "agent"), "--workdir", "/",
            *self._mounts(home, go, timing, program), "--entrypoint", NODE_IN_CONTAINER, harbor.image,
            BRIDGE_IN_CONTAINER, str(self.port), SOCKET_IN_CONTAINER, GO_IN_CONTAINER, TIMING_IN_CONTAINER,
            f"{wait_s:.0f}")
        process: Future[ProcessResult] = Future()

        def run() -> None:
            try:
                process.set_result(run_sandboxed(
                    podman, cwd=artifacts, home=artifacts / "podman-home", timeout_s=wait_s + plan.harness.timeout_s,
                    stdout_path=artifacts / layout.HARNESS_STDOUT, stderr_path=artifacts / layout.HARNESS_STDERR,
                    options=SandboxOptions(extra_env=self.runtime.env), stop=self.stop))
            except BaseException as exc:  # noqa: BLE001 - the session's run reports it
                process.set_exception(exc)

        container = _Container(name, go, timing, program, time.time(), process, ahead)
        threading.Thread(target=run, name="tracefleet-container", daemon=True).start()
        return container

    def run(self, plan: SessionPlan, argv: list[str], *, cwd: Path, home: Path, env: dict[str, str], timeout_s: float,
            stdout_path: Path, stderr_path: Path) -> ProcessResult:
        from tracefleet.runner.presets.base import harness_cache_dir

        harbor = plan.task.harbor
        assert harbor is not None and harbor.image, "ContainerPlace runs Harbor tasks with an image"
        artifacts = stdout_path.parent
        cache, program = harness_cache_dir(), Path(harness_program(argv))
        # a harness binary named outside the cache (TRACEFLEET_*_BIN) is mounted too: a container started ahead lacks it
        program = program if program.is_absolute() and program.exists() \
            and not program.resolve().is_relative_to(cache.resolve()) else None
        with self._lock:
            container = self._ahead.pop(artifacts, None)
        if container is not None and (container.program != program or container.process.done()
                                      or stdout_path != artifacts / layout.HARNESS_STDOUT):
            self._discard(container)
            container = None
        if container is None:
            container = self._start(plan, program)
        workdir = str(self.harness_workdir(plan, cwd))
        (artifacts / CONTAINER_RECORD).write_text(json.dumps({"name": container.name, "image": harbor.image,
                                                              "workdir": workdir, "home": str(home)}))
        task = load_task(Path(harbor.folder))
        config = task.config
        inside = {**base_env(home, home / ".tmp"), **config.environment.env, **env, "PATH": CONTAINER_PATH,
                  "PWD": workdir}
        spec = {"env": inside, "argv": argv, "user": "" if config.agent.user is None else str(config.agent.user),
                "workdir": workdir}
        if plan.evaluator.type == HARBOR_EVALUATOR:
            hold(artifacts, lambda: self._verifier(task, harbor.image, workdir, container.timing, timeout_s))
        with timed_to(artifacts / STEPS_FILE):
            went = time.time()
            # the spec (the session's secret in its environment) goes through the FIFO: never on a command line, in
            # podman's container config or in a file
            given = write_fifo(container.go, json.dumps(spec).encode(), alive=lambda: not container.process.done(),
                               wait_s=min(timeout_s, START_WAIT_S))
            container.go.unlink(missing_ok=True)  # a FIFO left in the session's folder would block whoever reads it
            gone = container.process.done()  # by itself (podman could not start it): its own error says why
            if not given:
                self.runtime.remove(container.name)
            try:
                proc = container.process.result(timeout=timeout_s)
            except FutureTimeout:  # the session's limit: the container is stopped (kept for the verifier)
                self.runtime.run("stop", "-t", "0", container.name, check=False, timeout=STOP_TIMEOUT_S)
                proc = replace(container.process.result(timeout=STOP_TIMEOUT_S), timed_out=True)
            if not given and not gone:
                proc = replace(proc, start_error=f"its container did not start within {min(timeout_s, START_WAIT_S):g} s")
            _record_run(container, went, time.time(), proc.exit_code)
            if proc.timed_out or proc.stopped:
                # the podman client is gone; the container may still run under conmon: stop it (kept for the verifier)
                self.runtime.run("stop", "-t", "0", container.name, check=False, timeout=STOP_TIMEOUT_S)
        return proc

    def _verifier(self, task: HarborTask, image: str, workdir: str, timing: Path, timeout_s: float) -> Verifier:
        """The session's verifier, started once the harness runs (its start then contends with the agent's work, not
        with the agent's container's start), held until the evaluator gives it the change set."""
        deadline = time.monotonic() + VERIFIER_AFTER_S
        while time.monotonic() < deadline and "started" not in timing.read_text():
            time.sleep(0.05)
        return Verifier(self.runtime, task, image, workdir=workdir, wait_s=timeout_s + READY_MARGIN_S)

    def workspace_diff(self, plan: SessionPlan, folders: SessionFolders) -> str:
        """What the session changed in the container's working directory, against the image's (both read in place
        through the runtime's mounts: tracefleet.runner.containers.changes), as the binary git patch a host session
        collects (session.patch: the diagnostics read it); and, from the same mount, the change set the verifier
        applies (CHANGE_SET)."""
        with timed_to(folders.artifacts / STEPS_FILE):
            return self._workspace_diff(folders)

    def _workspace_diff(self, folders: SessionFolders) -> str:
        record = container_of(folders.artifacts)
        if record is None:
            return ""  # the container never started: nothing changed
        scratch = folders.work / "container-diff"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        empty = scratch / "empty"  # a working directory the image (or the container) does not have
        empty.mkdir()
        # three independent calls at once; the mounts stay (rm unmounts the container's in `finish`, the image's is
        # every session's of that image until `close`): the verdict does not wait for them
        with ThreadPoolExecutor(3) as pool:
            calls = [pool.submit(contextvars.copy_context().run, *call) for call in (
                (layer_diff, self.runtime, record["name"]), (mount_container, self.runtime, record["name"]),
                (self._image_root, record["image"]))]
        diff, after, before = (c.result() for c in calls)
        try:
            # the verifier's input, from the same mount (the harbor evaluator applies it)
            write_change_set(after, diff, folders.artifacts / CHANGE_SET,
                             skip=(TOOLS_DIR, *((record["home"],) if record.get("home") else ())))
            go_ahead(folders.artifacts, folders.artifacts / CHANGE_SET)  # test.sh runs while the patch is made
            return tree_patch(within(before, record["workdir"]) or empty,
                              within(after, record["workdir"]) or empty, scratch / "git")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _image_root(self, image: str) -> Path:
        """The image's filesystem (the working directory as built), mounted by its first session, until `close`."""
        with self._lock:
            mounted = self._images.get(image)
            first = mounted is None
            if mounted is None:
                mounted = self._images[image] = Future()
        if first:
            try:
                mounted.set_result(mount_image(self.runtime, image))
            except BaseException as exc:
                with self._lock:
                    self._images.pop(image, None)  # the next session tries again
                mounted.set_exception(exc)
        return mounted.result()

    def close(self) -> None:
        """No session runs any more: remove the containers started ahead that none took, unmount the images."""
        with self._lock:
            ahead, self._ahead = list(self._ahead.values()), {}
            images, self._images = list(self._images.items()), {}
        for container in ahead:
            self._discard(container)
        for image, mounted in images:
            if mounted.done() and mounted.exception() is None:
                unmount_image(self.runtime, image)
        self._reaper.close()

    def _discard(self, container: _Container) -> None:
        """Remove a container no session will use, and wait for its `podman run` to end: a remove that came while
        podman was still creating it found nothing, and podman would then create it and leave it behind (a
        `Created` container after the run exited), so it is removed again until its `podman run` has ended."""
        deadline = time.monotonic() + DISCARD_WAIT_S
        self.runtime.remove(container.name)
        while not container.process.done() and time.monotonic() < deadline:
            try:
                container.process.result(timeout=DISCARD_POLL_S)
            except Exception:  # noqa: BLE001 - a timeout, or its failure: nobody's result, it is unused
                pass
            if not container.process.done():
                self.runtime.remove(container.name)
        container.go.unlink(missing_ok=True)

    def finish(self, result: SessionResult, folders: SessionFolders) -> None:
        release(folders.artifacts)  # a verifier no evaluator took (the session failed before its verdict)
        with self._lock:
            unused = self._ahead.pop(folders.artifacts, None)  # the session ended before its harness ran
        if unused is not None:
            self._discard(unused)
        shutil.rmtree(folders.artifacts / CHANGE_SET, ignore_errors=True)  # judged by now; it can be large
        record = container_of(folders.artifacts)
        if record is not None:
            with timed_to(folders.artifacts / STEPS_FILE):
                self.runtime.remove(record["name"])  # unmounts the container too
        super().finish(result, folders)
