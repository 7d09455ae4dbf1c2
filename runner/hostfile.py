"""Host lists: a hostfile (`host`, `host slots=N` or `host:N` per line; `#` comments and
blank lines allowed) or -H h1:2,h2:2. Duplicates and empty lists are errors that name the line."""
import ipaddress
import re
import socket
import threading
import time

from tarantella.runner.environment import UsageError

_LINE = re.compile(r"^(?P<host>[A-Za-z0-9_.\-\[\]]+)(?::(?P<colon>\d+))?(?:\s+slots\s*=\s*(?P<slots>\d+))?"
                   r"(?:\s+max[-_]slots\s*=\s*\d+)?$")


def _parse_entry(text, where):
    match = _LINE.match(text)
    if not match:
        raise UsageError(f"{where}: cannot read {text!r}: expected `host`, `host slots=N` or `host:N`")
    slots = match.group("colon") or match.group("slots")
    if slots is not None and int(slots) < 1:
        raise UsageError(f"{where}: slots must be at least 1. Received: {text!r}")
    return match.group("host"), (int(slots) if slots is not None else None)


def _check(entries, source):
    """entries: [(host, slots, where)] -> [(host, slots)]"""
    if not entries:
        # the hint is the list's own: -H takes names separated by commas, not lines
        how = "host names separated by commas: -H h1:2,h2:2" if source == "--hosts" else "one host name per line"
        raise UsageError(f"{source}: no host listed (write {how})")
    seen = {}
    for host, _, where in entries:
        if host in seen:
            raise UsageError(f"{where}: host {host!r} is listed twice (first at {seen[host]}); "
                             "give each host once, with slots=N for several ranks")
        seen[host] = where
    return [(host, slots) for host, slots, _ in entries]


def parse_hostfile(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"--hostfile {path}: cannot read it ({exc.strerror})") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            host, slots = _parse_entry(line, f"{path}:{number}")
            entries.append((host, slots, f"{path}:{number}"))
    return _check(entries, path)


def parse_hosts(spec):
    entries = []
    for i, item in enumerate(spec.split(","), 1):
        item = item.strip()
        if item:
            host, slots = _parse_entry(item, f"--hosts item {i}")
            entries.append((host, slots, f"--hosts item {i}"))
    return _check(entries, "--hosts")


def of_args(args):
    """[(host, slots)] of --hostfile, else of -H/--hosts; None when neither is given."""
    if args.hostfile:
        return parse_hostfile(args.hostfile)
    return parse_hosts(args.hosts) if args.hosts else None


RESOLVE_S = 2.0  # the longest wait for the host names' addresses (a slow DNS is not waited for)


_looked_up = {}  # tuple(hosts) -> _addresses: same_machine's, for this_host_only (once per job)


def _addresses(hosts, timeout_s, workers=32):
    key = tuple(hosts)
    if key not in _looked_up:
        _looked_up[key] = _lookup(hosts, timeout_s, workers)
    return _looked_up[key]


def _lookup(hosts, timeout_s, workers):
    """{host: set of its addresses} for the names that resolve within `timeout_s`, looked up by
    a few daemon threads (the engine names a host that does not resolve, as before, and a
    slow DNS delays neither the job nor tntrun's exit)."""
    found, todo, lock = {}, list(reversed(hosts)), threading.Lock()
    deadline = time.monotonic() + timeout_s

    def resolve():
        while time.monotonic() < deadline:
            with lock:
                if not todo:
                    return
                host = todo.pop()
            try:
                addrs = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
            except (OSError, UnicodeError):
                continue
            with lock:
                found[host] = addrs

    threads = [threading.Thread(target=resolve, daemon=True) for _ in range(min(workers, len(hosts)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    with lock:
        return dict(found)


def _is_local(address):
    """Whether `address` is one of this machine's (loopback included). Not whether it can be
    bound here: with net.ipv4.ip_nonlocal_bind=1 (hosts of keepalived, HAProxy, some
    Kubernetes nodes) any address can, and every job on two hosts was refused as "both this
    machine". The kernel's route to an address of this machine leaves from that address (its
    local table), a route to another machine from an address of this one (or there is none)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:  # an IPv6 address with a %scope: not compared
        return False
    if ip.is_loopback:
        return True
    try:
        with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((address, 9))  # UDP: no packet is sent, the route is chosen
            return ipaddress.ip_address(sock.getsockname()[0].split("%", 1)[0]) == ip
    except (OSError, ValueError):
        return False


def same_machine(hosts, timeout_s=RESOLVE_S):
    """The first two names of `hosts` that are one machine, and why: both this machine (its
    name and its address, localhost and its name...), or names that resolve to one address.
    None if there are none (or the names do not resolve). An engine given one machine under
    two names merges them into one node: Open MPI then refused the job in its own words
    ("more processes than the ppr for this topology can support")."""
    addresses = _addresses(hosts, timeout_s)
    local_of, seen = {}, {}
    for host in hosts:
        addrs = addresses.get(host) or set()
        mine = sorted(a for a in addrs if _is_local(a))
        if mine:
            if local_of:
                first, first_mine = next(iter(local_of.items()))
                return first, host, (f"are both this machine ({first}: {', '.join(first_mine)}; "
                                     f"{host}: {', '.join(mine)})")
            local_of[host] = mine
            continue
        for addr in sorted(addrs):
            if addr in seen and (_is_address(seen[addr]) or _is_address(host)):
                return seen[addr], host, f"resolve to one address, {addr}"
            seen.setdefault(addr, host)
    return None


def _is_address(host):
    """Whether `host` is written as an address. Two names of one address are refused only
    when one of them is the address itself: two host names can share an address they are not
    reached by (a wildcard DNS record answers for ssh aliases that ~/.ssh/config maps to
    machines of their own), and a false refusal would leave no way to run the job."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def this_host_only(hosts, timeout_s=RESOLVE_S):
    """Whether every name of `hosts` is this machine (each of its addresses is one of ours)."""
    addresses = _addresses(hosts, timeout_s)
    return all(addresses.get(host) and all(_is_local(a) for a in addresses[host]) for host in hosts)
