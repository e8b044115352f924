"""Python processes for this test suite, forked from one that has imported torch already.

The suite starts about two hundred Python processes (xdist workers of the runs under test, fresh
confirmation and update processes, pytester subprocesses). Each imported torch (about 2 s of CPU on the
2-core CI machine) and tore it down at exit (0.7 s more): more than half of the suite's CPU went there, not
to the behaviour under test. Here two server processes import torch once each; ``sys.executable`` of the
suite names a small launcher script instead of the interpreter, and every process started through it (by
the plugin, by xdist, by pytester, exactly as before: their code is not changed) is a fork of either server,
given the launcher's arguments, working folder, environment, standard streams and signals, and its exit
status goes back to the launcher. The fork has imported nothing of the plugin, the kernels or the tests;
what it imports, it imports itself, under the environment it was started with. What forks of one server
share that new interpreters would not: the hash seed (hence the two servers, picked at random per start)
and the addresses where torch's libraries were loaded (hence no server on a GPU host).

A start the server cannot reproduce exactly runs the real interpreter instead (``os.execv``): interpreter
options other than ``-u``/``-c``/``-m``, or an environment whose variables are read when torch is
imported (``TORCH_*``, ``OMP_*``, ``PYTHONHASHSEED``, ...) that differs from the server's. So does a test
marked ``fresh_interpreter`` (those that check what a new process does not import), and every process
when ``PERFGUARD_TEST_FORKSERVER=0``, which runs the suite as it ran before.

Usage (tests/conftest.py): ``start()`` in the outermost pytest process, ``stop()`` at its end.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import json
import os
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
# A GPU host runs every process as a new interpreter: there the suite's GPU tests time kernels, and a fresh
# process must be one, down to where its libraries were loaded.
NVIDIA_DEVICE = "/dev/nvidiactl"

# Environment variables read while torch (or Python itself) starts: a process whose value differs from
# the server's cannot be a fork of it.
_STARTUP_PREFIXES = ("TORCH_", "PYTORCH_", "OMP_", "MKL_", "KMP_", "GOMP_", "LD_", "MALLOC_")
_STARTUP_NAMES = (
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
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE",
    "PYTHONUSERBASE",
    "PYTHONPLATLIBDIR",
)

_HEADER = struct.Struct("!I")


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES}


def _send(sock: socket.socket, payload: bytes, fds: list[int] | None = None) -> None:
    data = _HEADER.pack(len(payload)) + payload
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def real_python() -> str:
    """The interpreter itself (its folder holds the venv's other commands), also where ``sys.executable``
    names the launcher."""
    return os.environ.get(REAL_PYTHON_ENV) or sys.executable


# ------------------------------------------------------------------------------------------------ launcher


def launch(argv: list[str]) -> None:
    """The launcher's body: hand this start to the server, or run the real interpreter."""
    real = real_python()
    paths = os.environ.get(SOCKET_ENV, "").split(os.pathsep)
    path = paths[os.urandom(1)[0] % len(paths)]
    request = _request(argv) if path and os.environ.get(SWITCH_ENV) != "0" else None
    sock = None
    if request is not None:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)  # type: ignore[arg-type]
        except OSError:
            sock = None
    if sock is None or request is None:
        os.execv(real, [real, *argv])
    _send(sock, json.dumps(request).encode(), [0, 1, 2])
    (pid,) = struct.unpack("!i", _recv_exact(sock, 4))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
    while True:
        try:
            (status,) = struct.unpack("!i", _recv_exact(sock, 4))
            break
        except InterruptedError:
            continue
        except EOFError:
            status = 1 << 8  # the server went away: as if the process failed
            break
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _request(argv: list[str]) -> dict[str, object] | None:
    """What the fork needs to be this start, or None where only a new interpreter can be."""
    unbuffered = False
    if argv and argv[0][:2] in ("-c", "-m") and len(argv[0]) > 2:  # "-mpytest", as pytester writes it
        argv = [argv[0][:2], argv[0][2:], *argv[1:]]
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-c", "-m", "-"):
        if argv[i] != "-u":
            return None
        unbuffered = True
        i += 1
    if i >= len(argv) or argv[i] == "-" or (argv[i] in ("-c", "-m") and i + 1 >= len(argv)):
        return None
    env = dict(os.environ)
    if _startup_env(env) != json.loads(env.get("_PERFGUARD_TEST_FORKSERVER_STARTUP_ENV", "{}")):
        return None
    umask = os.umask(0)
    os.umask(umask)
    return {
        "argv": argv[i:],
        "cwd": os.getcwd(),
        "env": env,
        "unbuffered": unbuffered,
        "umask": umask,
        "cpus": sorted(os.sched_getaffinity(0)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }


# ------------------------------------------------------------------------------------------------ server


def serve(path: str) -> None:
    """The server's loop: fork one child per connection; tell each launcher its child's exit status."""
    import torch  # noqa: F401  (the point of the server)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    import select

    while True:
        try:
            ready, _, _ = select.select([listener, wake_r], [], [], 1.0)
        except InterruptedError:
            ready = []
        if wake_r in ready:
            os.read(wake_r, 512)
        _reap(children)
        if listener in ready:
            conn, _ = listener.accept()
            try:
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                size = _HEADER.unpack(msg[:4])[0]
                payload = msg[4:]
                while len(payload) < size:
                    payload += _recv_exact(conn, size - len(payload))
                request = json.loads(payload)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                os.close(wake_r)
                os.close(wake_w)
                _child(conn, fds, request)  # never returns
            for fd in fds:
                os.close(fd)
            conn.sendall(struct.pack("!i", pid))
            children[pid] = conn


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(struct.pack("!i", status))
            conn.close()


def _child(conn: socket.socket, fds: list[int], request: dict) -> None:
    """Become the process the launcher was asked to start, run it, and exit with its status."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
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
    _watch(conn)
    argv = request["argv"]
    sys.path[:] = [_path0(argv, request["cwd"]), *_pythonpath(env), *_BASE_PATH]
    import importlib

    importlib.invalidate_caches()
    if "numpy.random" in sys.modules:  # seeded when the server imported it; `random` reseeds itself at fork
        sys.modules["numpy.random"].seed()
    code = _run(argv)
    _exit(code)


def _streams(unbuffered: bool) -> None:
    def text(fd: int, mode: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        tty = raw.isatty()
        buffered: io.BufferedIOBase = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            buffered,
            encoding="utf-8",
            errors="backslashreplace" if fd == 2 else "strict",
            line_buffering=mode == "w" and (tty or fd == 2) and not unbuffered,
            write_through=unbuffered and mode == "w",
        )

    sys.stdin = sys.__stdin__ = text(0, "r")
    sys.stdout = sys.__stdout__ = text(1, "w")
    sys.stderr = sys.__stderr__ = text(2, "w")


def _watch(conn: socket.socket) -> None:
    """End this process when its launcher ends (killed by a timeout, say), as a killed interpreter would."""

    def wait() -> None:
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, daemon=True, name="forkserver-launcher-watch").start()


def _path0(argv: list[str], cwd: str) -> str:
    if argv[0] == "-c":
        return ""
    if argv[0] == "-m":
        return cwd
    return os.path.dirname(os.path.realpath(argv[0]))


def _pythonpath(env: dict[str, str]) -> list[str]:
    return [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _run(argv: list[str]) -> int:
    import runpy
    import types

    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        _flush_all()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # what the interpreter does with an uncaught exception
        import traceback

        traceback.print_exc()
        return 1
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _flush_all() -> None:
    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase):  # not isinstance: some of torch's objects warn on __class__
            with contextlib.suppress(Exception):
                if not obj.closed and obj.writable():
                    obj.flush()


def _exit(code: int) -> None:
    """Leave as an interpreter leaves, less its teardown of every module (0.7 s of CPU with torch): the
    threads are joined, the exit functions run, and every open file is flushed first."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    _flush_all()
    os._exit(code)


_BASE_PATH: list[str] = []

# ------------------------------------------------------------------------------------------------ control

# Two servers, each with its own hash seed, and each start goes to either at random: a new interpreter
# draws its own seed, and two xdist workers that iterate one set in different orders must still be seen to.
SERVERS = 2
_SERVERS: list[subprocess.Popen[bytes]] = []
_FOLDER: str | None = None


def start() -> bool:
    """Start the servers and point this process's ``sys.executable`` (and its children's) at the launcher.
    False when switched off, on a GPU host, off Linux, or already serving (an inner session)."""
    global _FOLDER
    if os.environ.get(SWITCH_ENV) == "0" or os.environ.get(SOCKET_ENV) or os.path.exists(NVIDIA_DEVICE):
        return False
    if not sys.platform.startswith("linux"):  # CPU affinity and the launcher's fd passing: Linux's
        return False
    _FOLDER = tempfile.mkdtemp(prefix="perfguard-test-forkserver-")
    paths = [os.path.join(_FOLDER, f"socket{n}") for n in range(SERVERS)]
    launcher = os.path.join(_FOLDER, "python")
    real = sys.executable
    here = str(Path(__file__).parent)
    code = f"import sys; sys.path.insert(0, {here!r}); import forkserver; forkserver.launch(sys.argv[1:])"
    Path(launcher).write_text(f'#!/bin/sh\nexec {shlex.quote(real)} -S -c {shlex.quote(code)} "$@"\n')
    os.chmod(launcher, 0o755)
    os.environ[REAL_PYTHON_ENV] = real
    os.environ["_PERFGUARD_TEST_FORKSERVER_STARTUP_ENV"] = json.dumps(_startup_env(dict(os.environ)))
    from pytest_perfguard.run.cleanup import die_with_parent

    for path in paths:
        main = f"import sys; sys.path.insert(0, {here!r}); import forkserver; "
        main += f"forkserver._server_main({path!r}, {launcher!r})"
        # a killed session leaves no server behind
        _SERVERS.append(subprocess.Popen([real, "-c", main], stdin=subprocess.DEVNULL, preexec_fn=die_with_parent()))
    deadline = time.monotonic() + 120
    while not all(os.path.exists(path) for path in paths):
        if any(server.poll() is not None for server in _SERVERS) or time.monotonic() > deadline:
            stop()
            print("tests/forkserver.py: a server did not start; every process is a new interpreter", file=sys.stderr)
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
