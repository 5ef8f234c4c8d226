"""Node-side preflight probe: stdlib only, shipped as source text and run by the node's python.

``fleetctl check`` runs this once per node as ONE streamed remote command (every extra command
costs a remote shell start-up). It prints everything the controller needs in one go, then
optionally takes part in the N×N mesh test on the same channel. Every message is one frame
(``<tag> <json>``, see fleetctl/phases/frames.py):

1. ``D <facts>``: home, hostname, python, rsync, training NIC (address, MTU, speed, state),
   GPUs (nvidia-smi), free disk under the workdir, port bind tests, the clock, an optional
   environment's python/NCCL version (``envinfo.py``, run by the env's python), whether a code
   snapshot is already there.
2. with ``mesh``: bind a short-lived TCP listener on the training address (a port of the master
   port range, never the master port itself) and print ``R <port>`` (or ``N "<reason>"`` and
   exit).
3. read one JSON line from stdin: ``{"peers": [{"name", "addr", "port"}]}``; ping (ICMP from the
   training address, when permitted) and TCP-connect to every peer in parallel, print
   ``M <json>``.
4. keep the listener up until stdin closes (the others may still be testing us) or ``linger``
   seconds pass, then exit 0.
5. with ``hold`` (``fleetctl run``): instead of exiting, close the listener when the controller
   says the mesh is over (an empty line), then wait up to ``hold`` seconds for one JSON line
   ``{"code", "argv"}`` and run that code in this process with that argv: the node supervisor,
   which then owns this channel. The launch then costs no second remote command, shell and
   interpreter start on the node. EOF or the time limit: exit 0.

Arguments come as one JSON object in ``sys.argv[1]`` (installed as ``W/bin/probe_<sha12>.py``
and run from there, else shipped packed: see ``bootstrap.py`` and
``fleetctl.phases.check.probe_command``); ``envinfo`` in it carries
the source of ``envinfo.py``. Every wait here is bounded. Must stay importable by an older
node python (3.7+): no third-party imports, no newer syntax.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import socket
import struct
import sys
import threading
import time

try:  # as fleetctl.remote.<name> (tests); flat in W/bin/<name>_<sha>/ on a node
    from .workdirs import workdir_id
except ImportError:
    from workdirs import workdir_id

# subprocess is imported where a program is run: a node without GPUs runs one (rsync), and the
# import was a tenth of the probe's CPU; shutil and contextlib are not needed at all.

BAD_NIC_PREFIXES = ("docker", "virbr", "veth-docker")


def emit(kind: str, payload: object) -> None:
    """One frame: ``<kind> <json>``."""
    sys.stdout.write(f"{kind} {json.dumps(payload, sort_keys=True)}\n")
    sys.stdout.flush()


def which(name: str) -> str | None:
    """shutil.which for a plain name, without importing shutil."""
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def run(argv: list, timeout: float) -> tuple:
    """(exit code, stdout, stderr); 127 when the program is missing, 124 on timeout."""
    import subprocess

    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except FileNotFoundError as e:
        return 127, "", str(e)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout:g}s"
    except OSError as e:
        return 126, "", str(e)
    return (
        proc.returncode,
        proc.stdout.decode(errors="replace"),
        proc.stderr.decode(errors="replace"),
    )


def bounded(fn, timeout: float, default: object) -> object:
    """Run fn in a daemon thread; ``default`` if it does not finish (DNS can hang)."""
    box = [default]

    def target() -> None:
        try:
            box[0] = fn()
        except Exception as e:  # reported as data, never raised
            box[0] = {"error": str(e)}

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    return box[0]


class Task:
    """``fn(*args)`` on a daemon thread of its own; :meth:`result` waits a bounded time.

    Not concurrent.futures: its import (logging, traceback) cost every probe start ~14 ms of
    CPU, on every node, at every check."""

    def __init__(self, fn, *args) -> None:
        self.value: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self.thread.start()

    def _run(self, fn, args: tuple) -> None:
        try:
            self.value = fn(*args)
        except BaseException as e:  # re-raised by result(), in the caller's thread
            self.error = e

    def result(self, timeout: float) -> object:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"no answer within {timeout:g}s")
        if self.error is not None:
            raise self.error
        return self.value


def pmap(fn, items: list, width: int, timeout: float) -> list:
    """``[fn(x) for x in items]`` on up to ``width`` threads, in order; the first error is
    raised, and so is TimeoutError when they are not all done within ``timeout``."""
    out: list = [None] * len(items)
    errors: list = []
    todo = iter(range(len(items)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                out[i] = fn(items[i])
            except BaseException as e:  # re-raised below, in the caller's thread
                errors.append(e)
                return

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(width, len(items)))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"{len(items)} calls not done within {timeout:g}s")
    return out


# ---------------------------------------------------------------------------------- facts


def read_sys(iface: str, name: str) -> str | None:
    try:
        with open(f"/sys/class/net/{iface}/{name}") as f:
            return f.read().strip()
    except OSError:
        return None


def ipv4_netlink() -> dict | None:
    """Interface name -> its IPv4 addresses, as ``ip -4 addr`` lists them, asked of the kernel
    in-process (rtnetlink RTM_GETADDR dump): no ``ip`` process on every node. None when not on
    Linux or the answer cannot be read (the caller falls back to ``ip``)."""
    family = getattr(socket, "AF_NETLINK", None)
    if family is None:
        return None
    by_index: dict = {}
    try:
        with socket.socket(family, socket.SOCK_RAW, 0) as s:  # NETLINK_ROUTE
            s.settimeout(2.0)
            # nlmsghdr (length, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, seq, pid), ifaddrmsg
            header = struct.pack("=IHHII", 24, 22, 0x301, 1, 0)
            s.send(header + struct.pack("=BBBBI", socket.AF_INET, 0, 0, 0, 0))
            while True:
                data = s.recv(65536)
                if not data:
                    return None
                for kind, body in _netlink_messages(data):
                    if kind == 3:  # NLMSG_DONE
                        names = dict(socket.if_nameindex())
                        return {names.get(i, str(i)): a for i, a in by_index.items()}
                    if kind == 2:  # NLMSG_ERROR
                        return None
                    if kind == 20 and len(body) >= 8:  # RTM_NEWADDR: ifaddrmsg, then attributes
                        fam, _plen, _flags, _scope, index = struct.unpack_from("=BBBBI", body)
                        addr = _ifa_address(body[8:])
                        if fam == socket.AF_INET and addr:
                            by_index.setdefault(index, []).append(addr)
    except (OSError, struct.error, ValueError):
        return None


def _netlink_messages(data: bytes) -> list:
    """(type, body) of each netlink message in one datagram."""
    out, off = [], 0
    while off + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, off)
        if length < 16:
            break
        out.append((kind, data[off + 16 : off + length]))
        off += (length + 3) & ~3
    return out


def _ifa_address(attrs: bytes) -> str | None:
    """IFA_LOCAL (the address itself), else IFA_ADDRESS (the same but for point-to-point)."""
    found: dict = {}
    off = 0
    while off + 4 <= len(attrs):
        alen, atype = struct.unpack_from("=HH", attrs, off)
        if alen < 4:
            break
        if atype in (1, 2) and alen >= 8:
            found[atype] = socket.inet_ntoa(attrs[off + 4 : off + 8])
        off += (alen + 3) & ~3
    return found.get(2) or found.get(1)


def ipv4_by_iface() -> dict:
    """Interface name -> its IPv4 addresses: from the kernel (netlink), else ``ip -j``, else
    one per iface by ioctl."""
    got = ipv4_netlink()
    if got is not None:
        return got
    out: dict = {}
    ip = which("ip") or ("/sbin/ip" if os.path.exists("/sbin/ip") else None)
    if ip:
        code, stdout, _ = run([ip, "-j", "-4", "addr", "show"], 5)
        if code == 0:
            try:
                for entry in json.loads(stdout or "[]"):
                    addrs = [
                        a["local"]
                        for a in entry.get("addr_info", [])
                        if a.get("family") == "inet" and a.get("local")
                    ]
                    out[entry["ifname"]] = addrs
                return out
            except (ValueError, KeyError, TypeError):
                out = {}
    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError:
        names = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for name in names:
            try:
                req = struct.pack("256s", name.encode()[:15])
                res = fcntl.ioctl(s.fileno(), 0x8915, req)  # SIOCGIFADDR
                out[name] = [socket.inet_ntoa(res[20:24])]
            except OSError:
                out[name] = []
    finally:
        s.close()
    return out


def iface_info(name: str, addrs: list) -> dict:
    flags_text = read_sys(name, "flags")
    flags = int(flags_text, 16) if flags_text else 0
    speed_text = read_sys(name, "speed")
    speed = None
    if speed_text and speed_text.lstrip("-").isdigit() and int(speed_text) > 0:
        speed = int(speed_text)
    mtu_text = read_sys(name, "mtu")
    oper = read_sys(name, "operstate") or "unknown"
    carrier = read_sys(name, "carrier")
    up = oper == "up" or (oper == "unknown" and bool(flags & 0x1) and carrier != "0")
    return {
        "name": name,
        "addrs": addrs,
        "mtu": int(mtu_text) if mtu_text and mtu_text.isdigit() else None,
        "speed_mbps": speed,
        "operstate": oper,
        "carrier": carrier,
        "up": up,
        "loopback": bool(flags & 0x8) or name == "lo",
    }


def resolve_ipv4(host: str) -> list:
    infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    return sorted({i[4][0] for i in infos})


def is_loopback_addr(addr: str) -> bool:
    return addr.startswith("127.") or addr == "::1"


def pick_nic(args: dict) -> dict:
    """The training NIC: ``fleetctl_nic``, else the iface carrying the declared or SSH address."""
    by_iface = ipv4_by_iface()
    want_nic, want_addr = args.get("nic"), args.get("train_addr")
    allow_lo = bool(args.get("allow_loopback"))
    result: dict = {"ok": False, "all": sorted(by_iface)}
    name = None
    targets: list = []
    if want_nic:
        if want_nic not in by_iface and not os.path.exists(f"/sys/class/net/{want_nic}"):
            have = ", ".join(sorted(by_iface)) or "none"
            result["error"] = f"no interface {want_nic} (have: {have})"
            return result
        name = want_nic
    else:
        targets = [want_addr] if want_addr else []
        if not targets:
            resolved = bounded(lambda: resolve_ipv4(args["address"]), 3.0, None)
            if not isinstance(resolved, list):
                result["error"] = f"cannot resolve {args['address']} on the node"
                return result
            targets = resolved
        name = next((i for i, a in sorted(by_iface.items()) if set(targets) & set(a)), None)
        if name is None:
            result["error"] = (
                f"no interface carries {', '.join(targets)} (SSH through NAT or "
                "a jump host?); set fleetctl_nic"
            )
            return result
    info = iface_info(name, by_iface.get(name, []))
    result.update(info)
    if info["loopback"] and not allow_lo:
        result["error"] = f"{name} is loopback; other nodes cannot reach it (set fleetctl_nic)"
        return result
    if name.startswith(BAD_NIC_PREFIXES):
        result["error"] = f"{name} is a container/VM bridge, not a training network"
        return result
    addrs = info["addrs"]
    if not addrs:
        result["error"] = f"{name} has no IPv4 address"
        return result
    if want_addr and want_addr not in addrs:
        have = ", ".join(addrs)
        result["error"] = f"{name} does not carry fleetctl_addr {want_addr} (has {have})"
        return result
    matching = [a for a in addrs if a in targets]
    addr = want_addr or (matching[0] if matching else addrs[0])
    if is_loopback_addr(addr) and not allow_lo:
        result["error"] = f"training address {addr} is loopback"
        return result
    # A down NIC keeps its address: the mesh then shows which pairs it cuts.
    result["addr"] = addr
    if not info["up"]:
        why = "no carrier" if info["carrier"] == "0" else info["operstate"]
        result["error"] = f"{name} is down ({why})"
        return result
    result["ok"] = True
    return result


def gpu_facts() -> dict:
    exe = which("nvidia-smi")
    if not exe:
        return {"present": False}
    code, out, err = run(
        [
            exe,
            "--query-gpu=index,name,memory.total,driver_version,uuid,memory.used",
            "--format=csv,noheader",
        ],
        10,
    )
    if code != 0:
        last = (err or out).strip().splitlines()
        return {
            "present": True,
            "path": exe,
            "error": f"nvidia-smi exited {code}" + (f": {last[-1]}" if last else ""),
        }
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4 and parts[0].isdigit():
            gpu = {"index": int(parts[0]), "name": parts[1], "memory": parts[2], "driver": parts[3]}
            if len(parts) >= 6:
                gpu["uuid"] = parts[4]
                used = parts[5].split()[0] if parts[5] else ""
                gpu["used_mib"] = int(used) if used.isdigit() else None
            gpus.append(gpu)
    return {"present": True, "path": exe, "gpus": gpus, "apps": compute_apps(exe)}


def compute_apps(exe: str) -> list | None:
    """Processes on the GPUs now (another job's, at check time): nvidia-smi's compute apps."""
    code, out, _ = run(
        [exe, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
        10,
    )
    if code != 0:
        return None
    apps = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[1].isdigit():
            mib = parts[2] if parts[2].isdigit() else "0"
            apps.append({"gpu_uuid": parts[0], "pid": int(parts[1]), "used_mib": int(mib)})
    return apps


def rsync_facts() -> dict:
    exe = which("rsync")
    if not exe:
        return {"present": False}
    code, out, err = run([exe, "--version"], 5)
    first = (out or err).strip().splitlines()[:1]
    version = None
    if first:
        words = first[0].split()
        if "version" in words and words.index("version") + 1 < len(words):
            version = words[words.index("version") + 1]
    return {
        "present": code == 0,
        "path": exe,
        "version": version,
        "error": None if code == 0 else f"rsync --version exited {code}",
    }


def expand(path: str, home: str) -> str:
    if path == "~":
        return home
    if path.startswith("~/"):
        return home.rstrip("/") + path[1:]
    return path


def disk_facts(workdir: str) -> dict:
    path = os.path.abspath(workdir)
    probe = path
    while not os.path.exists(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe)
    except OSError as e:
        return {"path": path, "checked": probe, "error": str(e)}
    writable = os.access(probe, os.W_OK)
    return {
        "path": path,
        "checked": probe,
        "free": st.f_bavail * st.f_frsize,
        "total": st.f_blocks * st.f_frsize,
        "writable": writable,
    }


def port_free(port: int) -> str | None:
    """None when a server could bind ``port`` on all addresses (as torch's store does)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", port))
        s.listen(1)
    except OSError as e:
        return "in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
    finally:
        s.close()
    return None


def env_facts(env_dir: str, imports: list, envinfo: str) -> dict:
    """The env's python, NCCL and imports, by running ``envinfo.py`` (its source: ``envinfo``)
    with the env's own python."""
    py = os.path.join(env_dir, "bin", "python")
    if not os.path.isdir(env_dir):
        return {"present": False, "path": env_dir}
    if not os.path.exists(py):
        return {"present": True, "path": env_dir, "error": f"{py} missing"}
    query = json.dumps({"prefix": env_dir, "imports": imports})
    code, out, err = run([py, "-c", envinfo, query], 60)
    if code != 0:
        last = (err or out).strip().splitlines()
        return {
            "present": True,
            "path": env_dir,
            "error": f"env python exited {code}" + (f": {last[-1]}" if last else ""),
        }
    data = last_data(out)
    if data is None:
        return {"present": True, "path": env_dir, "error": "env python printed no result"}
    data.update({"present": True, "path": env_dir})
    return data


# Imports the launcher's module in a child of this very python (the one that runs the
# launcher), so a broken or missing install shows here, not as a failed start on every node.
LAUNCHER_IMPORT = (  # not from the current folder (the home): see fleetctl.remote.inline
    "import sys\n"
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "import importlib, json\n"
    "importlib.import_module(sys.argv[1])\n"
    "top = sys.modules[sys.argv[1].split('.')[0]]\n"
    "torch = sys.modules.get('torch')\n"  # deepspeed's: the flight recorder's name depends on it
    "print('D ' + json.dumps({'version': str(getattr(top, '__version__', '') or ''),\n"
    "    'torch': str(getattr(torch, '__version__', '') or '')}))\n"
)

# torch's version as installed for this python, without importing it (seconds): for a job with
# no launcher module (plain), whose flight-recorder variable's name depends on it.
TORCH_VERSION = (
    "import sys\n"
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "import json\n"
    "try:\n"
    "    from importlib.metadata import version\n"
    "    v = version('torch')\n"
    "except Exception:\n"  # not installed, or python 3.7 (no importlib.metadata)
    "    v = ''\n"
    "print('D ' + json.dumps({'version': v}))\n"
)


def torch_facts() -> dict:
    """``{"version"}``: torch's installed version for this python ('' when none)."""
    code, out, _ = run([sys.executable, "-c", TORCH_VERSION], 30)
    data = last_data(out) if code == 0 else None
    return {"version": str((data or {}).get("version") or "")}


def launcher_facts(module: str) -> dict:
    """Whether ``module`` imports with this python; the top package's version when it does."""
    code, out, err = run([sys.executable, "-c", LAUNCHER_IMPORT, module], 90)
    data = last_data(out) if code == 0 else None
    if data is None:
        lines = [ln for ln in (err or out).strip().splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exited {code}"
        return {"module": module, "error": why[:300]}
    out = {"module": module, "version": data.get("version") or ""}
    if data.get("torch"):
        out["torch"] = data["torch"]
    return out


def last_data(out: str) -> dict | None:
    """The last ``D <json object>`` frame of a program's output (lines before it may be noise)."""
    for line in reversed(out.splitlines()):
        if line.startswith("D "):
            try:
                data = json.loads(line[2:])
            except ValueError:
                continue
            if isinstance(data, dict):
                return data
    return None


def gather(args: dict) -> dict:
    home = os.environ.get("HOME") or os.path.expanduser("~")
    workdir = expand(args.get("workdir") or "~/.fleetctl", home)
    if not os.path.isabs(workdir):
        workdir = os.path.join(home, workdir)
    facts: dict = {
        "home": home,
        "hostname": socket.gethostname(),
        "login_shell": os.environ.get("SHELL") or "",  # sshd sets it: the login shell
        "python": {"version": sys.version.split()[0], "executable": sys.executable},
        "workdir": workdir,
        "pid": os.getpid(),  # the process a held probe runs the supervisor in (``hold``)
    }
    facts["nic"] = pick_nic(args)
    # The order of the slow parts does not matter: run them side by side.
    gpu = Task(gpu_facts)
    rs = Task(rsync_facts)
    mod = args.get("launcher_module")
    launcher = Task(launcher_facts, mod) if mod else None
    torch = Task(torch_facts) if args.get("torch_version") else None
    env = None
    if args.get("env_dir"):
        env_dir = expand(args["env_dir"], home)
        if not os.path.isabs(env_dir):
            env_dir = os.path.join(workdir, env_dir)
        imports = list(args.get("env_imports") or [])
        env = Task(env_facts, env_dir, imports, args.get("envinfo") or "")
    facts["disk"] = disk_facts(workdir)
    facts["workdir_id"] = workdir_id(workdir)
    facts["ports"] = {str(p): port_free(int(p)) for p in args.get("ports") or []}
    host_addrs = bounded(lambda: resolve_ipv4(facts["hostname"]), 2.0, None)
    facts["hostname_addrs"] = host_addrs if isinstance(host_addrs, list) else None
    if args.get("code_dir"):
        code_dir = expand(args["code_dir"], home)
        if not os.path.isabs(code_dir):
            code_dir = os.path.join(workdir, code_dir)
        facts["code_present"] = os.path.isdir(code_dir)
    facts["gpu"] = gpu.result(timeout=15)
    facts["rsync"] = rs.result(timeout=10)
    facts["env"] = env.result(timeout=70) if env is not None else None
    facts["launcher"] = launcher.result(timeout=100) if launcher is not None else None
    if torch is not None:
        facts["torch"] = torch.result(timeout=40)
    facts["time"] = time.time()
    return facts


# ----------------------------------------------------------------------------------- mesh


class StdinLines:
    """Line reader on fd 0 with timeouts (the controller talks to us over the SSH channel)."""

    def __init__(self) -> None:
        self.buf = b""
        self.eof = False

    def readline(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf and not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([0], [], [], left)
            if not ready:
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                self.eof = True
            self.buf += chunk
        if b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            return line
        return None

    def wait_eof(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select([0], [], [], left)
            if ready and not os.read(0, 65536):
                self.eof = True


def listen(addr: str, base: int, span: int, avoid: set) -> tuple:
    """(socket, port) of a listener on ``addr`` in base..base+span-1, or (None, reason)."""
    last = "no port tried"
    for port in range(base, base + span):
        if port in avoid:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Like real servers: a TIME_WAIT left by the last check must not move us to another port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
            s.listen(256)
        except OSError as e:
            s.close()
            last = f"cannot listen on {addr}:{port}: {e.strerror or e}"
            if e.errno == errno.EADDRINUSE:
                continue
            return None, last
        return s, port
    return None, last


def serve(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except socket.timeout:  # an alias of TimeoutError only from 3.10
            continue
        except OSError:
            return
        conn.close()


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


_ECHO_SEQ = [0]
_ECHO_LOCK = threading.Lock()


def icmp_echo(src: str, dst: str, timeout: float) -> str | None:
    """One ICMP echo from ``src`` to ``dst`` inside this process — no ``ping`` process per
    peer, which at 64+ hosts costs more than the mesh itself. An unprivileged datagram ICMP
    socket where ``net.ipv4.ping_group_range`` allows it, else a raw socket (root); None when
    neither may be opened (the caller falls back to the ``ping`` binary)."""
    raw = False
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    except OSError:
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
            raw = True
        except OSError:
            return None
    with _ECHO_LOCK:
        _ECHO_SEQ[0] = (_ECHO_SEQ[0] + 1) & 0xFFFF
        seq = _ECHO_SEQ[0]
    ident = (os.getpid() ^ threading.get_ident()) & 0xFFFF
    token = os.urandom(8)
    header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    packet = struct.pack("!BBHHH", 8, 0, _checksum(header + token), ident, seq) + token
    deadline = time.monotonic() + timeout
    try:
        s.bind((src, 0))
        s.sendto(packet, (dst, 0))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            s.settimeout(left)
            try:
                data, addr = s.recvfrom(2048)
            except socket.timeout:
                return "timeout"
            if raw:  # a raw socket sees every ICMP packet, IP header first
                data = data[(data[0] & 0x0F) * 4 :]
            if addr[0] != dst or len(data) < 16 or data[0] != 0:
                continue
            _type, _code, _sum, rid, rseq = struct.unpack("!BBHHH", data[:8])
            # a datagram socket's id is the kernel's (its port): match on seq and payload
            if rseq == seq and data[8:16] == token and (rid == ident or not raw):
                return "ok"
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "timeout"
        if e.errno in (errno.EPERM, errno.EACCES):
            return None
        return "error: " + (e.strerror or str(e))
    finally:
        s.close()


def ping(src: str, dst: str, timeout: float) -> str:
    echo = icmp_echo(src, dst, timeout)
    if echo is not None:
        return echo
    exe = which("ping")
    if not exe:
        return "n/a: no ping"
    code, out, err = run(
        [exe, "-n", "-c1", f"-W{max(1, int(timeout))}", "-I", src, dst], timeout + 2
    )
    if code == 0:
        return "ok"
    text = (err + out).lower()
    if "not permitted" in text or "permission denied" in text or "socket:" in text:
        return "n/a: ICMP not permitted"
    if code == 1 or code == 124:
        return "timeout"
    last = (err or out).strip().splitlines()
    return "error: " + (last[-1] if last else f"ping exited {code}")


def tcp(src: str, dst: str, port: int, timeout: float) -> str:
    """Open a TCP connection to ``dst:port`` from ``src`` within ``timeout``: "ok" or why not.

    A "no route to host" is tried again until the time is up: it is also what the kernel
    reports for every packet queued on a stale neighbour entry, one whose address resolution
    ran out while the peer's link was down, even if the link is back (a peer that recovered
    seconds ago). The next attempt resolves afresh; a link that is really down fails again.
    """
    deadline = time.monotonic() + timeout
    last = "timed out"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return last
        try:
            s = socket.create_connection((dst, port), timeout=left, source_address=(src, 0))
        except socket.timeout:  # an alias of TimeoutError only from 3.10
            return "timed out"
        except ConnectionRefusedError:
            return "refused"
        except OSError as e:
            if e.errno == errno.EHOSTUNREACH:
                last = "unreachable"
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            if e.errno == errno.ENETUNREACH:
                return "unreachable"
            return e.strerror or str(e)
        s.close()
        return "ok"


def route_source(dst: str) -> str | None:
    """The source address the kernel picks for ``dst`` (no packet is sent)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((dst, 9))
        return s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()


def load_factor(most: float) -> float:
    """How much slower than idle this host runs now: 1-minute load per CPU, 1..most."""
    try:
        load = os.getloadavg()[0] / max(1, os.cpu_count() or 1)
    except OSError:
        return 1.0
    return min(most, max(1.0, load))


def mesh(
    src: str, peers: list, timeout: float, max_slowdown: float = 2.0, link_up: bool = True
) -> dict:
    """Ping and TCP-connect every peer. A pair that fails is tried once more with timeouts
    2 x this host's slowdown longer (``load_factor``): a busy host answers late, a cut link
    never does. Not retried: a peer that gave no echo where other peers did (the kernel
    answers echoes however busy the host is, so its address is not reachable at all: a cut
    link, a host down), and nothing when this host's own training NIC has no link
    (``link_up`` False: the check fails it for that). Either retry would only wait out the
    longer timeouts: 10 s of a 64-host check with one data link cut, on this lab."""

    def one(peer: dict, ping_t: float, tcp_t: float) -> tuple:
        p = Task(ping, src, peer["addr"], ping_t)
        conn = tcp(src, peer["addr"], int(peer["port"]), tcp_t)
        echo = p.result(timeout=ping_t + 10)
        if conn == "ok" and echo != "ok" and not echo.startswith("n/a"):
            # The one echo may have died with a stale neighbour entry (see ``tcp``); now that
            # TCP got through, the peer's address is resolved: a filtered ICMP still fails.
            echo = ping(src, peer["addr"], ping_t)
        return peer["name"], {"ping": echo, "tcp": conn, "route_src": route_source(peer["addr"])}

    def run_all(todo: list, ping_t: float, tcp_t: float) -> None:
        width = min(32, len(todo))
        rounds = -(-len(todo) // width) if todo else 0
        bound = rounds * (2 * ping_t + tcp_t + 10)  # one's worst case: 2 echoes, 1 connect
        for name, res in pmap(lambda p: one(p, ping_t, tcp_t), todo, width, bound):
            results[name] = res

    results: dict = {}
    run_all(peers, 1.0, timeout)
    echoes = any(r["ping"] == "ok" for r in results.values())  # ICMP gets through from here
    # "refused" is an answer (nothing listens); a timeout may be this host or the peer busy
    again = [
        p
        for p in peers
        if link_up
        and results[p["name"]]["tcp"] not in ("ok", "refused")
        and not (echoes and results[p["name"]]["ping"] != "ok")
    ]
    if again:
        slow = 2.0 * load_factor(max_slowdown)
        run_all(again, slow, timeout * slow)
        for p in again:
            results[p["name"]]["retried"] = round(slow, 2)
    return {"src": src, "peers": results}


def handoff(stdin: StdinLines, hold: float) -> int:
    """Stay for the launch: run the controller's next line's code (the supervisor's start) in
    this process. The controller sends nothing after it until the code speaks first."""
    line = stdin.readline(hold)
    if not line:
        return 0
    msg = json.loads(line.decode())
    sys.argv[1:] = [str(a) for a in msg["argv"]]
    code = compile(msg["code"], "fleetctl-handoff", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    return 0


def main() -> int:
    args = json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}")
    hold = float(args.get("hold") or 0)
    facts = gather(args)
    emit("D", facts)
    if not args.get("mesh"):
        return handoff(StdinLines(), hold) if hold > 0 else 0
    nic = facts["nic"]
    if not nic.get("addr"):
        emit("N", nic.get("error") or "no training address")
        return 0
    avoid = {int(p) for p in args.get("avoid_ports") or []}
    sock, port = listen(nic["addr"], int(args["mesh_port"]), int(args.get("mesh_span", 64)), avoid)
    if sock is None:
        emit("N", port)
        return 0
    stop = threading.Event()
    server = threading.Thread(target=serve, args=(sock, stop), daemon=True)
    server.start()
    stdin = StdinLines()
    try:
        emit("R", port)
        line = stdin.readline(float(args.get("peer_wait", 30)))
        if line is None:
            emit("M", {"error": "no peer list from the controller"})
            return 0
        peers = json.loads(line.decode() or "{}").get("peers") or []
        timeout, most = float(args.get("mesh_timeout", 2)), float(args.get("max_slowdown", 2))
        emit("M", mesh(nic["addr"], peers, timeout, most, nic.get("up") is not False))
        if hold <= 0:
            stdin.wait_eof(float(args.get("linger", 30)))
            return 0
        if stdin.readline(float(args.get("linger", 30))) is None:  # EOF: no launch follows
            return 0
    finally:
        stop.set()
        sock.close()
        server.join(2.0)  # no thread of ours left running under the supervisor
    return handoff(stdin, hold)


def program() -> None:
    """Run as the node's program, installed (``fleetctl.phases.check.probe_command``)."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
