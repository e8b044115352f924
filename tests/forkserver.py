"""The Python processes this suite starts, forked from servers that have imported torch.

About four hundred processes (390 counted 2026-11-28: xdist workers of the runs under test, fresh
confirmation and update processes, pytester subprocesses) each imported torch (2-2.5 s of CPU on the 2-core
CI machine) and tore it down (0.7 s): more than half of the suite's CPU. Here ``sys.executable`` names a
launcher; each start through it (by the plugin, xdist or pytester, their code unchanged) becomes a fork of a
server, given the launcher's arguments, folder, environment, umask, CPU affinity, nice value and standard
streams; signals go to it and its exit status comes back. A fork has imported torch and pytest, nothing of
the plugin, kernels or tests; what the server holds is frozen out of the garbage collector's view
(gc.freeze). Forks of one server share its hash seed, so two servers with their own seeds take starts at
random; they share where torch's libraries were loaded, so a GPU host never uses this. A start a fork cannot
be (an interpreter option other than -u, a variable read at torch's import that differs) runs the real
interpreter, as does every start under ``PERFGUARD_TEST_FORKSERVER=0`` or in a test marked
``fresh_interpreter``. The session's terminal summary counts both (`tally`).

It is what keeps CI's suite within its 10 minutes, and nothing CI's verdicts depend on: on the 2-core CI
machine, 2026-11-28, one tree at `-n 2`, 464 s with the forks and 915 s (1764 s of CPU) without, the same
tests passing (docs/reference.md).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import json
import os
import select
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SOCKET_ENV = "PERFGUARD_TEST_FORKSERVER_SOCKET"
SWITCH_ENV = "PERFGUARD_TEST_FORKSERVER"  # "0": every process is a new interpreter
REAL_PYTHON_ENV = "PERFGUARD_TEST_REAL_PYTHON"
STARTUP_ENV = "PERFGUARD_TEST_FORKSERVER_STARTUP_ENV"
NVIDIA_DEVICE = "/dev/nvidiactl"  # a GPU host: its tests time kernels, and a fresh process must be one
SERVERS = 2
# Read while Python and torch start: a start whose values differ from the servers' cannot be a fork.
_STARTUP_PREFIXES = ("TORCH_", "PYTORCH_", "OMP_", "MKL_", "KMP_", "GOMP_", "LD_", "MALLOC_")
_STARTUP_NAMES = {
    "PYTHONHASHSEED",
    "PYTHONWARNINGS",
    "PYTHONIOENCODING",
    "PYTHONUTF8",
    "PYTHONOPTIMIZE",
    "PYTHONMALLOC",
    "PYTHONDEVMODE",
    "PYTHONFAULTHANDLER",
    "PYTHONTRACEMALLOC",
    "PYTHONHOME",
    "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE",
    "PYTHONUSERBASE",
    "PYTHONPLATLIBDIR",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
}
_INT = struct.Struct("!i")
TALLY = "starts"  # beside the sockets: one byte a start through the launcher (`_count`)


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES}


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def real_python() -> str:
    """The interpreter itself (its folder holds the venv's commands), also where sys.executable is the launcher."""
    return os.environ.get(REAL_PYTHON_ENV) or sys.executable


def _count(path: str, how: bytes) -> None:
    """One start, as a fork (b"f") or a new interpreter (b"n"), in the session's tally (`tally`)."""
    with contextlib.suppress(OSError):
        fd = os.open(os.path.join(os.path.dirname(path), TALLY), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, how)
        finally:
            os.close(fd)


def launch(argv: list[str]) -> None:
    """The launcher: hand this start to a server and wait for its status, or run the real interpreter."""
    paths = os.environ.get(SOCKET_ENV, "").split(os.pathsep)
    path = paths[os.urandom(1)[0] % len(paths)]
    request = _request(argv) if path and os.environ.get(SWITCH_ENV) != "0" else None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if request is None:
            raise OSError
        sock.connect(path)
    except OSError:
        if path:
            _count(path, b"n")
        os.execv(real_python(), [real_python(), *argv])
    _count(path, b"f")
    payload = json.dumps(request).encode()
    socket.send_fds(sock, [struct.pack("!I", len(payload)) + payload], [0, 1, 2])
    (pid,) = _INT.unpack(_recv(sock, 4))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
    try:
        (status,) = _INT.unpack(_recv(sock, 4))
    except EOFError:
        status = 1 << 8  # the server went away: as if the process failed
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _request(argv: list[str]) -> dict[str, object] | None:
    """What the fork needs to be this start, or None where only a new interpreter can be."""
    unbuffered = bool(argv) and argv[0] == "-u"
    argv = argv[1:] if unbuffered else argv
    if argv and argv[0][:2] in ("-c", "-m") and len(argv[0]) > 2:  # "-mpytest", as pytester writes it
        argv = [argv[0][:2], argv[0][2:], *argv[1:]]
    if not argv or argv[0] == "-" or (argv[0].startswith("-") and (argv[0] not in ("-c", "-m") or len(argv) < 2)):
        return None
    env = dict(os.environ)
    if _startup_env(env) != json.loads(env.get(STARTUP_ENV, "{}")):
        return None
    umask = os.umask(0)
    os.umask(umask)
    cpus = sorted(os.sched_getaffinity(0))
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    return {
        "argv": argv,
        "cwd": os.getcwd(),
        "env": env,
        "unbuffered": unbuffered,
        "umask": umask,
        "cpus": cpus,
        "nice": nice,
    }


def serve(path: str) -> None:
    """A server: fork one child per connection; tell each launcher its child's exit status."""
    # torch is the point of the server; pytest runs in nearly every start (pytester's runs, xdist workers,
    # fresh confirmation and update processes), 0.2 s of CPU each.
    import pytest  # noqa: F401
    import torch  # noqa: F401

    # What the server holds (torch's 165,000 objects) leaves the collector's view: a fork's collections and
    # its exit's flush (_flush_all) go through the objects of its own run only, not torch's, each time.
    gc.collect()
    gc.freeze()

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        ready = select.select([listener, wake_r], [], [], 1.0)[0]
        if wake_r in ready:
            os.read(wake_r, 512)
        while children:  # reap, and report
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            done = children.pop(pid, None)
            if done is not None:
                with contextlib.suppress(OSError):
                    done.sendall(_INT.pack(status))
                done.close()
        if listener in ready:
            conn = listener.accept()[0]
            try:
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(msg[4:] + _recv(conn, struct.unpack("!I", msg[:4])[0] - len(msg) + 4))
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                for held in (listener, *children.values()):  # the other launchers' connections are theirs
                    held.close()
                os.close(wake_r)
                os.close(wake_w)
                _child(conn, fds, request)
            for fd in fds:
                os.close(fd)
            conn.sendall(_INT.pack(pid))
            children[pid] = conn


def _child(conn: socket.socket, fds: list[int], request: dict) -> None:
    """Become the process the launcher was asked to start, run it, and exit with its status."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.sched_setaffinity(0, request["cpus"])
    os.setpriority(os.PRIO_PROCESS, 0, request["nice"])
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    _streams(request["unbuffered"] or bool(env.get("PYTHONUNBUFFERED")))
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    sys.pycache_prefix = env.get("PYTHONPYCACHEPREFIX") or None
    # The launcher's end (killed by a timeout, say) ends this process, as it would a new interpreter.
    threading.Thread(target=lambda: (_drain(conn), os.kill(os.getpid(), signal.SIGKILL)), daemon=True).start()
    argv, cwd = request["argv"], request["cwd"]
    path0 = "" if argv[0] == "-c" else cwd if argv[0] == "-m" else os.path.dirname(os.path.realpath(argv[0]))
    sys.path[:] = [path0, *_pythonpath(env), *_BASE_PATH]
    import importlib

    importlib.invalidate_caches()
    if "numpy.random" in sys.modules:  # seeded when the server imported it; `random` reseeds itself at fork
        sys.modules["numpy.random"].seed()
    _exit(_run(argv))


def _drain(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while conn.recv(1):
            pass


def _streams(unbuffered: bool) -> None:
    def text(fd: int, mode: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        tty = raw.isatty()
        buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            buffered,  # type: ignore[arg-type]
            encoding="utf-8",
            errors="backslashreplace" if fd == 2 else "strict",
            line_buffering=mode == "w" and (tty or fd == 2) and not unbuffered,
            write_through=unbuffered and mode == "w",
        )

    sys.stdin = sys.__stdin__ = text(0, "r")
    sys.stdout = sys.__stdout__ = text(1, "w")
    sys.stderr = sys.__stderr__ = text(2, "w")


def _pythonpath(env: dict[str, str]) -> list[str]:
    return [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _run(argv: list[str]) -> int:
    """Run -c code, -m module or a script as the interpreter would; the exit status."""
    import runpy
    import traceback
    import types

    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return (exc.code or 0) & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        _flush_all()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _flush_all() -> None:
    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase):  # not isinstance: some of torch's objects warn on __class__
            with contextlib.suppress(Exception):
                if not obj.closed and obj.writable():
                    obj.flush()


def _exit(code: int) -> None:
    """Leave as an interpreter leaves, less its teardown of every module (0.7 s of CPU with torch): threads
    joined, exit functions run, every open file flushed."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    _flush_all()
    os._exit(code)


_BASE_PATH: list[str] = []
_SERVERS: list[subprocess.Popen[bytes]] = []
_FOLDER: str | None = None
_OFF: list[str] = []  # why the servers are not there, where they failed to start


def start() -> bool:
    """Start the servers; point this process's sys.executable (and its children's) at the launcher. False
    when switched off, on a GPU host, off Linux, or already serving (an inner session)."""
    global _FOLDER
    if os.environ.get(SWITCH_ENV) == "0" or os.environ.get(SOCKET_ENV) or os.path.exists(NVIDIA_DEVICE):
        return False
    if not sys.platform.startswith("linux"):  # fd passing and CPU affinity as Linux has them
        return False
    from pytest_perfguard.run.cleanup import die_with_parent

    _FOLDER = tempfile.mkdtemp(prefix="perfguard-test-forkserver-")
    paths = [os.path.join(_FOLDER, f"socket{n}") for n in range(SERVERS)]
    launcher, real, here = os.path.join(_FOLDER, "python"), sys.executable, str(Path(__file__).parent)
    prefix = f"import sys; sys.path.insert(0, {here!r}); import forkserver; forkserver."
    code = prefix + "launch(sys.argv[1:])"
    Path(launcher).write_text(f'#!/bin/sh\nexec {shlex.quote(real)} -S -c {shlex.quote(code)} "$@"\n')
    os.chmod(launcher, 0o755)
    os.environ[REAL_PYTHON_ENV] = real
    os.environ[STARTUP_ENV] = json.dumps(_startup_env(dict(os.environ)))
    for path in paths:  # die_with_parent: a killed session leaves no server behind
        main = prefix + f"_server_main({path!r}, {launcher!r})"
        _SERVERS.append(subprocess.Popen([real, "-c", main], stdin=subprocess.DEVNULL, preexec_fn=die_with_parent()))
    deadline = time.monotonic() + 120
    while not all(os.path.exists(path) for path in paths):
        if any(server.poll() is not None for server in _SERVERS) or time.monotonic() > deadline:
            stop()
            print("tests/forkserver.py: a server did not start; every process is a new interpreter", file=sys.stderr)
            _OFF[:] = ["a server did not start"]
            return False
        time.sleep(0.05)
    os.environ[SOCKET_ENV] = os.pathsep.join(paths)
    sys.executable = launcher
    return True


def _server_main(path: str, launcher: str) -> None:
    own = {"", str(Path(__file__).parent), *_pythonpath(dict(os.environ))}
    _BASE_PATH[:] = [p for p in sys.path if os.path.abspath(p) not in own and p not in own]
    sys.executable = launcher
    serve(path)


def tally() -> str:
    """What the session's Python starts were, for its terminal summary: a CI log says whether it ran with
    the forks (the suite takes about half the time it takes without them: docs/reference.md)."""
    sockets = os.environ.get(SOCKET_ENV)
    if not sockets or _OFF:
        why = "switched off" if os.environ.get(SWITCH_ENV) == "0" else (_OFF or ["off (a GPU host, or not Linux)"])[0]
        return f"tests/forkserver.py {why}: every Python process this session started was a new interpreter"
    try:
        starts = Path(os.path.dirname(sockets.split(os.pathsep)[0]), TALLY).read_bytes()
    except OSError:
        starts = b""
    forks = starts.count(b"f")
    return (
        f"tests/forkserver.py: {len(starts)} Python starts, {forks} of them forks of a server that had imported "
        f"torch and pytest, {len(starts) - forks} new interpreters (a start a fork cannot be, or a test marked "
        "fresh_interpreter)"
    )


def stop() -> None:
    for server in _SERVERS:
        server.terminate()
    for server in _SERVERS:
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    _SERVERS.clear()
    if _FOLDER is not None:
        import shutil

        shutil.rmtree(_FOLDER, ignore_errors=True)
