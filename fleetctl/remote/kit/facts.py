"""The check probe's facts (its ``D`` frame): home, hostname, python, the training NIC, GPUs,
rsync, free disk, port binds, an environment's python and NCCL, the launcher's import, the
clock. Slow parts run side by side, each wait bounded.

Node module: stdlib only, Python >= 3.8 (the probe's: 3.7+).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import struct
import sys
import time

from .health import health_facts
from .waits import Task, bounded, run, which
from .workdirs import workdir_id

# subprocess is imported where a program is run: a node without GPUs runs one (rsync), and the
# import was a tenth of the probe's CPU.

BAD_NIC_PREFIXES = ("docker", "virbr", "veth-docker")


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
    infos = socket.getaddrinfo(lookup_name(host), None, socket.AF_INET, socket.SOCK_STREAM)
    return sorted({i[4][0] for i in infos})


def lookup_name(host: str) -> bytes | str:
    """``host`` as getaddrinfo should get it: an ASCII name as bytes, which is what the idna
    codec makes of it, without importing that codec (with ``unicodedata``: ~4 ms of the
    probe's CPU, on every node); any other name (or one the codec refuses: an empty label or
    one over 63 characters) as it is, for the codec to encode or refuse as before."""
    try:
        name = host.encode("ascii")
    except UnicodeEncodeError:
        return host
    labels = name.split(b".")
    if labels[-1] == b"" and len(labels) > 1:
        labels.pop()
    return name if all(0 < len(x) < 64 for x in labels) else host


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

# ``run -m MODULE`` of a module not in the pushed code: whether ``python -m`` would find it
# installed, as runpy does (a package: its ``__main__``), without running it: find_spec only
# imports the parent packages.
MODULE_FIND = (
    "import sys\n"
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "import importlib.util, json\n"
    "name = sys.argv[1]\n"
    "try:\n"
    "    spec = importlib.util.find_spec(name)\n"
    "    if spec is not None and spec.submodule_search_locations is not None:\n"
    "        spec = importlib.util.find_spec(name + '.__main__')\n"
    "        if spec is None:\n"
    "            raise ImportError(name + ' is a package with no __main__')\n"
    "    if spec is None:\n"
    "        raise ImportError('No module named ' + repr(name))\n"
    "    out = {'origin': str(spec.origin or '')}\n"
    "except Exception as e:\n"
    "    out = {'error': (type(e).__name__ + ': ' + str(e))[:300]}\n"
    "print('D ' + json.dumps(out))\n"
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
    """``{"version"}``: torch's installed version for this python ('' when none).

    Read from the name of torch's dist-info folder in the first folder of the job python's
    path that has one; only where none does, a second interpreter asks importlib.metadata
    (it also sees folders added by ``.pth`` files). That interpreter cost every node ~60 ms CPU
    per run (site, importlib.metadata and the scan), a third of a no-op run's remote work."""
    version = dist_version("torch", site_dirs())
    if version is not None:
        return {"version": version}
    code, out, _ = run([sys.executable, "-c", TORCH_VERSION], 30)
    data = last_data(out) if code == 0 else None
    return {"version": str((data or {}).get("version") or "")}


def site_dirs() -> list:
    """The folders the job python (started without ``-S``) searches, in its order: PYTHONPATH,
    the user site, the venv's site (its ``pyvenv.cfg``: under ``-S``, as the probe runs,
    ``sys.prefix`` is still the base's), the base's site unless the venv hides it."""
    import site  # under -S: its functions only; nothing is run or added to sys.path

    dirs = [d for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d]
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    venv, system = None, True
    for cfg in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(exe_dir, "..", "pyvenv.cfg")):
        try:
            with open(cfg) as f:
                text = f.read()
        except OSError:
            continue
        venv = os.path.dirname(os.path.abspath(cfg))
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key.strip().lower() == "include-system-site-packages":
                system = value.strip().lower() == "true"
        break
    if (venv is None or system) and not os.environ.get("PYTHONNOUSERSITE"):
        dirs.append(site.getusersitepackages())
    if venv is not None:
        ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        for lib in dict.fromkeys(("lib", getattr(sys, "platlibdir", "lib"))):
            dirs.append(os.path.join(venv, lib, ver, "site-packages"))
    if venv is None or system:
        dirs += site.getsitepackages()
    return list(dict.fromkeys(dirs))


def dist_version(name: str, dirs: list) -> str | None:
    """``name``'s version from ``<name>-<version>.dist-info`` in the first of ``dirs`` holding
    one; None when none does or that folder holds two (a broken install: ask importlib)."""
    prefix, suffix = name + "-", ".dist-info"
    for d in dirs:
        try:
            found = [
                n[len(prefix) : -len(suffix)]
                for n in os.listdir(d)
                if n.startswith(prefix) and n.endswith(suffix)
            ]
        except OSError:
            continue
        if found:
            return found[0] if len(found) == 1 else None
    return None


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


def module_facts(module: str) -> dict:
    """Whether this python's ``-m MODULE`` finds an installed module (``origin``), or why not."""
    code, out, err = run([sys.executable, "-c", MODULE_FIND, module], 60)
    data = last_data(out) if code == 0 else None
    if data is None:
        lines = [ln for ln in (err or out).strip().splitlines() if ln.strip()]
        data = {"error": (lines[-1] if lines else f"exited {code}")[:300]}
    return {"module": module, **data}


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
    health = Task(health_facts, args) if args.get("health") else None
    mod = args.get("launcher_module")
    launcher = Task(launcher_facts, mod) if mod else None
    script_mod = args.get("script_module")
    script = Task(module_facts, script_mod) if script_mod else None
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
    if script is not None:
        facts["script_module"] = script.result(timeout=70)
    if torch is not None:
        facts["torch"] = torch.result(timeout=40)
    # within the probe's default 30 s: nvidia-smi -q -x 10 s, the kernel log 8 s at most;
    # dcgmi's level 1 takes a minute or two (check --dcgm gives the probe 150 s more)
    if health is not None:
        try:
            facts["health"] = health.result(timeout=140 if args.get("dcgm") else 20)
        except Exception as e:  # a broken source is the check's finding, not the probe's end
            facts["health"] = {"error": f"health sources: {type(e).__name__}: {e}"}
    facts["time"] = time.time()
    return facts
