"""A tiny LD_PRELOAD library that narrows wildcard binds to the pod's address, built on first use.

Dev-node pods share the machine's network. Two real pods may both listen on 0.0.0.0:29500 (rank 0's
c10d store) or 0.0.0.0:9400 (the trainer's metrics); here the second would fail with EADDRINUSE.
The library rewrites a bind to 0.0.0.0 into a bind to $PHALANX_DEVNODE_POD_IP, and one to :: into
::ffff:<pod IP> (falling back to :: when the socket is IPv6-only), so each pod has its own ports, as
its own network namespace would give it. It covers C++ listeners too, which a Python-level hook
(pyhook/sitecustomize.py, the fallback when no C compiler is found) cannot.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

SOURCE = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    const char *pod_ip = getenv("PHALANX_DEVNODE_POD_IP");
    struct in_addr pod;
    if (!addr || !pod_ip || inet_pton(AF_INET, pod_ip, &pod) != 1) return real_bind(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in narrowed;
        memcpy(&narrowed, addr, sizeof narrowed);
        if (narrowed.sin_addr.s_addr == htonl(INADDR_ANY)) {
            narrowed.sin_addr = pod;
            return real_bind(fd, (const struct sockaddr *)&narrowed, sizeof narrowed);
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 narrowed;
        memcpy(&narrowed, addr, sizeof narrowed);
        if (IN6_IS_ADDR_UNSPECIFIED(&narrowed.sin6_addr)) {
            memset(&narrowed.sin6_addr, 0, sizeof narrowed.sin6_addr);
            narrowed.sin6_addr.s6_addr[10] = 0xff;
            narrowed.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&narrowed.sin6_addr.s6_addr[12], &pod, 4);
            int saved = errno;
            if (real_bind(fd, (const struct sockaddr *)&narrowed, sizeof narrowed) == 0) return 0;
            if (errno != EINVAL && errno != EADDRNOTAVAIL) return -1;
            errno = saved; /* an IPv6-only socket cannot take a v4-mapped address: keep :: */
        }
    }
    return real_bind(fd, addr, len);
}
"""


def build_bind_shim(directory: Path) -> Path | None:
    """Compiles the library into `directory` (once per source version); None without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    library = directory / f"libphalanx-bind-{digest}.so"
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"phalanx-bind-{digest}.c"
    source.write_text(SOURCE)
    partial = library.with_suffix(".partial")
    built = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(source), "-ldl"],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        return None
    partial.replace(library)
    return library
