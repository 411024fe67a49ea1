"""Image roots for the fake cluster when no static agent is built: a busybox
root with the dynamic agent's libraries (its `ldd` list and loader), so the
agent image and the cells' image run the debug or release `orch-agent` of
this build. Usage: roots.py AGENT CELL_ROOT AGENT_ROOT"""

import os
import shutil
import subprocess
import sys


def make_root(root, agent):
    for d in ["bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "proc", "dev", "sys", "tmp", "var/tmp",
              "usr/lib/x86_64-linux-gnu", "usr/lib64"]:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    shutil.copy("/bin/busybox", os.path.join(root, "bin/busybox"))
    for line in subprocess.run(["/bin/busybox", "--list-full"], capture_output=True, text=True).stdout.split():
        at = os.path.join(root, line.strip("/"))
        if line.strip("/") == "bin/busybox" or os.path.lexists(at):
            continue
        os.makedirs(os.path.dirname(at), exist_ok=True)
        os.symlink("/bin/busybox", at)
    for name, text in [("passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("group", "root:x:0:\n"),
                       ("hosts", "127.0.0.1\tlocalhost\n")]:
        open(os.path.join(root, "etc", name), "w").write(text)
    lib = os.path.join(root, "usr/lib/x86_64-linux-gnu")
    for line in subprocess.run(["ldd", agent], capture_output=True, text=True).stdout.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            shutil.copy(os.path.realpath(path), os.path.join(lib, os.path.basename(path)))
    for link, to in [("lib", "usr/lib"), ("lib64", "usr/lib64")]:
        if not os.path.lexists(os.path.join(root, link)):
            os.symlink(to, os.path.join(root, link))
    os.symlink("../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", os.path.join(root, "usr/lib64/ld-linux-x86-64.so.2"))


agent, cell_root, agent_root = sys.argv[1:4]
make_root(cell_root, agent)
make_root(agent_root, agent)
# Stripped: every running pod gets a copy.
subprocess.run(["strip", "-o", os.path.join(agent_root, "orch-agent"), agent], check=True)
