"""An `ssh` stand-in for the multi-host test bed (multihost_testbed.py).

Invoked as `ssh [options] DESTINATION COMMAND...` (through the `ssh` script the test bed puts
first on PATH, which passes the test bed's map file first), it does what ssh does for a
remote command, with a network namespace in place of a remote machine:

- DESTINATION (`host`, `user@host`, `ssh://user@host:port`, or the host's address) names a
  host of the test bed; an unknown one fails like ssh: "Could not resolve hostname", 255;
- the words of COMMAND are joined with spaces and run by the remote shell (`/bin/sh -c`), as
  sshd runs them: quoting that the caller wrote for the remote shell (Open MPI's
  `-mca ess "env"`) is parsed there, not here;
- the command runs inside the host's network namespace, under its own host name (a UTS
  namespace), in the user's home directory, with a fresh login environment (HOME, USER,
  LOGNAME, SHELL, PATH): nothing of the caller's environment crosses, as with real ssh;
- the exit status is the remote command's (128 + N for a signal, as ssh reports it), 255 for
  an error of ssh itself;
- `-n` reads stdin from /dev/null; other options (`-x`, `-T`, `-o ...`, `-p ...`, `-i ...`)
  are accepted and ignored; `-f`, `-N`, port forwarding and interactive logins are refused.

Every call is appended to the map file's log (one JSON line: host and command), so tests can
check that a launcher really went through ssh.
"""
import json
import os
import pwd
import sys

# ssh options that take an argument (from ssh(1))
WITH_ARG = set("BbcDEeFIiJLlmOopQRSWw")
REFUSED = {"f": "going to the background (-f)", "N": "no command (-N)",
           "L": "port forwarding (-L)", "R": "port forwarding (-R)", "D": "port forwarding (-D)",
           "W": "stdio forwarding (-W)", "w": "tunnels (-w)", "M": "master mode (-M)",
           "O": "control commands (-O)"}


def fail(message):
    sys.stderr.write(f"ssh: {message}\n")
    sys.exit(255)


def parse(argv):
    """(options {letter: value or True}, destination, [command words])"""
    options = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        letters = word[1:]
        j = 0
        while j < len(letters):
            letter = letters[j]
            if letter in WITH_ARG:
                value = letters[j + 1:]
                if not value:
                    i += 1
                    if i >= len(argv):
                        fail(f"option requires an argument -- {letter}")
                    value = argv[i]
                options[letter] = value
                break
            options[letter] = True
            j += 1
        i += 1
    if i >= len(argv):
        fail("no destination given (usage: ssh [options] destination command)")
    return options, argv[i], argv[i + 1:]


def main(argv):
    map_file, args = argv[0], argv[1:]
    with open(map_file) as f:
        testbed = json.load(f)
    options, destination, words = parse(args)
    for letter, why in REFUSED.items():
        if letter in options:
            fail(f"the test bed's ssh stand-in does not support {why}")
    user = pwd.getpwuid(os.getuid())
    if destination.startswith("ssh://"):
        destination = destination[len("ssh://"):]
        if destination.rsplit(":", 1)[-1].isdigit():
            destination = destination.rsplit(":", 1)[0]
    login, _, host = destination.rpartition("@")
    login = login or options.get("l") or user.pw_name
    by_address = {h["address"]: name for name, h in testbed["hosts"].items()}
    name = host if host in testbed["hosts"] else by_address.get(host)
    if name is None:
        fail(f"Could not resolve hostname {host}: Name or service not known")
    if login != user.pw_name:
        fail(f"{login}@{host}: Permission denied (the stand-in logs in as {user.pw_name} only)")
    if not words:
        fail("the test bed's ssh stand-in runs commands only, not interactive logins")
    command = " ".join(words)
    with open(testbed["log"], "a") as log:
        log.write(json.dumps({"host": name, "command": command, "argv": args}) + "\n")
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name,
           "SHELL": "/bin/sh", "PATH": testbed["path"]}
    for key in ("LANG", "LC_ALL"):  # what ssh's default SendEnv passes on
        if key in os.environ:
            env[key] = os.environ[key]
    if "n" in options:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    host_argv = [testbed["ip"], "netns", "exec", testbed["hosts"][name]["netns"],
                 testbed["unshare"], "--uts", "/bin/sh", "-c",
                 'hostname "$1" || exit 255; cd || exit 255; exec /bin/sh -c "$2"',
                 "ssh-standin", name, command]
    os.execve(host_argv[0], host_argv, env)


if __name__ == "__main__":
    main(sys.argv[1:])
