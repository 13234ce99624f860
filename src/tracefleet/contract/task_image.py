"""Where the containers of a pod that runs a task's own image meet: the shared volume's layout and file names.

A Harbor task's image has no tracefleet Python in it, so on a cluster its pods pair the task-image container with
containers of the tracefleet image (tracefleet.harbor.task_image_programs holds the shell programs the task image
runs; tracefleet.runner.pod.task_image the session program's place; tracefleet.runner.pod.harbor_verifier the
evaluator Job's steps). They talk through files in one emptyDir, named here.

Harness pod (volume SHARED_DIR, mounted in the task container and the session container):

    bundle/                 the harness bundle the init container copied in (BUNDLE_BIN on the harness's PATH)
    launch/ready            the task container's launcher is up; holds its working directory (the task's workdir)
    launch/workdir-before.tar  that working directory as the image has it, taken before the harness starts (not
                            for a working directory of `/`): with the change set, the session's patch
                            (session.patch, what the diagnostics read), as `tracefleet run` makes it
    launch/request.sh       the session program's launch: the harness's environment, cwd and argv (written last,
                            by rename)
    launch/stop             the session program asks for the harness's process group to be killed
    launch/done             the session program has finished: a launcher still waiting for a request exits
    launch/harness.stdout   the harness's output
    launch/harness.stderr
    launch/changes.tar      what the agent changed in the task container's root filesystem (files, links and
                            folders whose ctime is after the launcher started; `find / -xdev`)
    launch/deleted.txt      what the agent deleted there, one absolute path a line
    launch/exit_code        the harness's exit status, written after changes.tar and deleted.txt (so its presence
                            means the change set is complete)

Evaluator Job (volumes: SHARED_DIR for the change set and the verifier's output; the tests' and the verifier
logs' own emptyDirs mounted at /tests and /logs/verifier in the task container):

    eval/changes.tar, eval/deleted.txt    the session's change set, downloaded by the fetch step
    eval/fetch_error                      one line when the fetch step could not get them (verify then skips)
    eval/tests/                           the task's tests/, from the task source (never from the session)
    eval/test-output.txt                  test.sh's stdout and stderr
    eval/exit_code                        test.sh's exit status
    eval/timed_out                        present when test.sh ran past [verifier].timeout_sec
    eval/duration_s                       how long test.sh ran
    verifier-logs/                        the verifier logs' emptyDir as the report step mounts it
"""

from __future__ import annotations

# The evaluator preset of a Harbor job (its tasks' tests/test.sh judge) and the judge named in its reward.json.
HARBOR_EVALUATOR = "harbor"

SHARED_VOLUME = "tracefleet"
SHARED_DIR = "/tracefleet"
BUNDLE_DIR = f"{SHARED_DIR}/bundle"
BUNDLE_BIN = f"{BUNDLE_DIR}/bin"
# Where a bundle image holds the bundle the init container copies (tracefleet.runner.containers.bundle makes it).
BUNDLE_SOURCE_DIR = "/opt/tracefleet/bundle"

LAUNCH_DIR = f"{SHARED_DIR}/launch"
READY = "ready"
WORKDIR_BEFORE = "workdir-before.tar"
REQUEST = "request.sh"
STOP = "stop"
DONE = "done"
HARNESS_STDOUT = "harness.stdout"
HARNESS_STDERR = "harness.stderr"
CHANGES = "changes.tar"
DELETED = "deleted.txt"
EXIT_CODE = "exit_code"

EVAL_DIR = f"{SHARED_DIR}/eval"
EVAL_TESTS = "tests"
FETCH_ERROR = "fetch_error"
TEST_OUTPUT = "test-output.txt"
TIMED_OUT = "timed_out"
DURATION = "duration_s"
VERIFIER_LOGS_DIR = f"{SHARED_DIR}/verifier-logs"

# Paths the change set never carries and the verifier never takes from it: the verifier's inputs and outputs, and
# what the kubelet mounts into every container.
NEVER_CHANGED = ("/tests", "/logs/verifier", SHARED_DIR, "/etc/hosts", "/etc/hostname", "/etc/resolv.conf",
                 "/dev/termination-log")

# The task image's system folders: what of them the image holds is never taken from an agent's change set, and the
# folders on a PATH (a new program there must not shadow one of the image's). tracefleet.harbor.task_image_programs.VERIFIER.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
PROGRAM_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# [verifier].user, for the verifier step that applies the change set as root and runs test.sh as this user.
VERIFIER_USER_ENV = "TRACEFLEET_VERIFIER_USER"

# Seconds between the TERM and the KILL to the harness's process group after a stop (the launcher's, and what the
# session container waits for on top of its collect wait).
STOP_GRACE_S = 5
