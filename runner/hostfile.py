"""Host lists: a hostfile (`host`, `host slots=N` or `host:N` per line; `#` comments and
blank lines allowed) or -H h1:2,h2:2. Duplicates and empty lists are errors that name the line."""
import re

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
        raise UsageError(f"{source}: no host listed (write one host name per line)")
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
