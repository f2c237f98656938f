"""Unpacking archives safely: tar (and, where allowed, zip) under the rules of tarfile's "data" filter,
checked member by member, within a byte budget and the free disk space; for an archive an API caller gave (an
adapter), also within a member limit counted before anything is written, and within the fetch's deadline.

Why one module: one concern, unpacking an archive within its bounds: tar and zip share the member
rules (:func:`_member_problem`), the byte budget (:class:`_Budget`) and the member limit's refusal, which would
otherwise be public names of the package for two modules' sake.

Part of :mod:`cog_triton.weights` (its public face is the package).
"""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import lzma
import os
import posixpath
import stat
import struct
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import BinaryIO, Iterator, Optional

from cog_triton.fetch.deadline import FetchDeadline
from cog_triton.fetch.folders import check_free_space
from cog_triton.weights.sources import SUPPORTED_KINDS
from common.errors import ArchiveError, FetchDeadlineError, ManifestError, WeightsError
from common.files import CHUNK_BYTES, VERIFIED_NAME
from tensorrtllm_backend.manifest import MANIFEST_NAME, Manifest

log = logging.getLogger("cog_triton.weights")


#: Without manifest.json and without an explicit limit, the unpacked files may total this many
#: times the archive's size ...
EXTRACT_RATIO = 20


#: ... or this many bytes, whichever is more.
EXTRACT_FLOOR_BYTES = 1 << 30


#: With manifest.json (at the archive root or in its only folder): the sizes of the files it lists,
#: plus manifest.json itself, plus this many bytes.
MANIFEST_SLACK_BYTES = 1 << 20


#: A manifest.json larger than this (bytes) is not read to set the limit.
MANIFEST_MAX_BYTES = 64 << 20


#: Members nested deeper than this many path components are refused ...
MAX_MEMBER_DEPTH = 64


#: ... and so are member paths and link targets longer than this many bytes (UTF-8; Linux's PATH_MAX).
MAX_MEMBER_PATH_BYTES = 4096


#: Member names in error messages are cut to this many characters.
SHOWN_NAME_CHARS = 120


#: With a member limit (an archive an API caller gave), the tar stream itself (decompressed) may be longer than the
#: bytes it unpacks to by this many bytes per member: its 512-byte header, up to 511 bytes padding its data, and the
#: extended headers a long name needs (a GNU long name or long link, or a pax header: each a 512-byte header and the
#: name, up to :data:`MAX_MEMBER_PATH_BYTES`), with room to spare; and by :data:`TAR_END_BYTES` more for the end of
#: the archive (two zero blocks, padded to GNU tar's 10240-byte record). Beyond it the archive is refused as it is
#: read: this bounds what tarfile reads into memory for an extended header (it reads a header's whole declared size,
#: CPython ``Lib/tarfile.py`` ``TarInfo._proc_gnulong`` / ``_proc_pax``) and how long counting the members can take.
TAR_MEMBER_OVERHEAD_BYTES = 16 << 10
TAR_END_BYTES = 20 << 10


#: With a member limit, a zip archive's central directory may take this many bytes per member allowed: a 46-byte
#: entry, its name up to :data:`MAX_MEMBER_PATH_BYTES`, and 1 KiB of extra fields and comment (PKWARE's APPNOTE.TXT
#: 4.3.12). zipfile reads and parses the whole central directory before anything else (CPython ``Lib/zipfile.py``
#: ``ZipFile._RealGetContents``, which ignores the entry count the end record states), so its size is checked
#: first, from the end record (:func:`_zip_directory`).
ZIP_DIRECTORY_BYTES_PER_MEMBER = 46 + MAX_MEMBER_PATH_BYTES + 1024


_HAS_DATA_FILTER = hasattr(tarfile, "data_filter")


_FILTER_ERRORS: tuple[type[BaseException], ...] = (
    (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()  # type: ignore[attr-defined]
)


_COMPRESSION_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))


_UNSUPPORTED_MAGIC = (
    (b"PK\x03\x04", "a zip archive"),
    (b"PK\x05\x06", "an (empty) zip archive"),
    (b"(\xb5/\xfd", "zstd-compressed"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
)


def _corrupt(display: str, detail: object) -> ArchiveError:
    return ArchiveError(f"the weights archive {display} is corrupt or truncated ({detail}); "
                        "download or build it again")


def _show(name: str) -> str:
    """``name`` quoted for a message, cut to :data:`SHOWN_NAME_CHARS` characters."""
    if len(name) <= SHOWN_NAME_CHARS:
        return repr(name)
    return f"{name[:SHOWN_NAME_CHARS]!r}... ({len(name)} characters)"


@dataclass
class _Budget:
    """How many bytes an archive may unpack to (``limit``, and why: ``reason``), and how many it has.

    ``declared`` sums the regular members' header sizes, checked before each member is written;
    ``written`` counts the bytes actually written. An automatic limit is tightened by the archive's
    own manifest.json once that member has been unpacked.
    """

    display: str
    staging: Path
    limit: int
    reason: str
    explicit: bool
    declared: int = 0
    written: int = 0
    manifest_seen: bool = False

    fix: str = "If the archive is genuine, set COG_TRITON_MAX_EXTRACTED_BYTES to a larger number of bytes"

    @classmethod
    def for_archive(cls, display: str, staging: Path, archive_size: int, explicit: Optional[int],
                    explicit_reason: Optional[str] = None) -> "_Budget":
        if explicit is not None:
            if explicit_reason is not None:  # the caller's words (its settings, and how to raise them)
                return cls(display, staging, explicit, explicit_reason, True, fix="")
            return cls(display, staging, explicit, f"COG_TRITON_MAX_EXTRACTED_BYTES={explicit}", True)
        limit = max(EXTRACT_RATIO * archive_size, EXTRACT_FLOOR_BYTES)
        reason = (f"{EXTRACT_RATIO} times the archive's {archive_size} bytes, at least {EXTRACT_FLOOR_BYTES} bytes, "
                  f"as it has no {MANIFEST_NAME} to tell")
        return cls(display, staging, limit, reason, False)

    def _over(self, what: str) -> ArchiveError:
        return ArchiveError(
            f"the weights archive {self.display} unpacks to more than allowed: {what}, over the limit of {self.limit} "
            f"bytes ({self.reason}); refusing to unpack it" + (f". {self.fix}" if self.fix else "")
        )

    def declare(self, member: tarfile.TarInfo) -> None:
        """Count a regular member's declared size before it is written; check the limit and free space."""
        self.declare_bytes(member.name, member.size)

    def declare_bytes(self, name: str, size: int) -> None:
        """Count ``size`` declared bytes of member ``name`` before it is written; check the limit and free space."""
        self.declared += size
        if self.declared > self.limit:
            raise self._over(f"member {_show(name)} ({size} bytes) brings it to {self.declared} bytes")
        check_free_space(self.staging, size, f"member {_show(name)} ({size} bytes) of {self.display}")

    def wrote(self, count: int, name: str) -> None:
        """Count ``count`` bytes just read for member ``name``, before they are written."""
        self.written += count
        if self.written > self.limit:
            raise self._over(f"{self.written} bytes were written, the last of them for member {_show(name)}")

    def apply_manifest(self, member: tarfile.TarInfo) -> None:
        """Tighten an automatic limit to what the just-unpacked manifest.json ``member`` lists."""
        self.manifest_seen = True
        where = f"{self.display}: {member.name}"
        try:
            with open(self.staging / member.name, "rb") as fh:
                data = json.loads(fh.read(MANIFEST_MAX_BYTES + 1))
            manifest = Manifest.from_json(data, where)
        except (OSError, ValueError, ManifestError) as exc:
            log.info("%s is not a manifest we can read (%s); the unpacked size stays limited to %d bytes",
                     where, exc, self.limit)
            return
        listed = sum(f.size for f in manifest.files)
        expected = listed + member.size
        if not self.explicit and expected + MANIFEST_SLACK_BYTES < self.limit:
            self.limit = expected + MANIFEST_SLACK_BYTES
            self.reason = (f"the {listed} bytes of files listed in its {MANIFEST_NAME}, plus {member.size} bytes for "
                           f"{MANIFEST_NAME} itself and {MANIFEST_SLACK_BYTES} bytes of slack")
            log.debug("%s: unpacked size limited to %d bytes by %s", self.display, self.limit, MANIFEST_NAME)
            if self.declared > self.limit:
                raise self._over(f"{self.declared} bytes were unpacked up to and including {_show(member.name)}")
        if expected > self.declared:
            check_free_space(self.staging, expected - self.declared,
                              f"the rest of {self.display} (its {MANIFEST_NAME} lists {listed} bytes of files)")


def _data_mode(member: tarfile.TarInfo) -> Optional[int]:
    """The mode tarfile's ``data`` filter gives ``member``; None: leave the default (directories, symlinks)."""
    if member.mode is None or not (member.isreg() or member.islnk()):
        return None
    mode = member.mode & 0o755  # no setuid/setgid/sticky, no group/other write
    if not mode & stat.S_IXUSR:
        mode &= ~0o111  # executable for group/other only if for the owner too
    return mode | 0o600  # the owner can read and write


class _SafeTarFile(tarfile.TarFile):
    """A TarFile that unpacks by the rules of tarfile's ``data`` filter on every Python, and counts bytes.

    Regular files and hard links get :func:`_data_mode`; directories are made with the default mode
    (the archive's is ignored); owners are never set, whoever runs it (``chown`` does nothing);
    every byte of a regular file counts against ``budget`` before it is written.
    """

    budget: Optional[_Budget] = None
    deadline: Optional[FetchDeadline] = None

    def chown(self, tarinfo: tarfile.TarInfo, targetpath: str, numeric_owner: bool) -> None:
        """Never change owners: the archive's uid/gid/uname/gname are ignored."""

    def chmod(self, tarinfo: tarfile.TarInfo, targetpath: str) -> None:
        """Apply :func:`_data_mode`, or nothing for directories and symlinks."""
        mode = _data_mode(tarinfo)
        if mode is None:
            return
        try:
            os.chmod(targetpath, mode)
        except OSError as exc:
            raise tarfile.ExtractError("could not change mode") from exc

    def makedir(self, tarinfo: tarfile.TarInfo, targetpath: str) -> None:
        """Make a directory with the process's default mode (umask applies)."""
        try:
            os.mkdir(targetpath)
        except FileExistsError:
            if not os.path.isdir(targetpath):
                raise

    def makefile(self, tarinfo: tarfile.TarInfo, targetpath: str) -> None:
        """Write a regular member, counting each chunk against ``budget`` first."""
        if tarinfo.sparse is not None:  # refused earlier by _member_problem; never half-supported here
            raise tarfile.ExtractError(f"sparse member {tarinfo.name!r}")
        source = self.fileobj
        assert source is not None
        source.seek(tarinfo.offset_data)
        remaining = tarinfo.size
        with open(targetpath, "wb") as target:
            while remaining > 0:
                chunk = source.read(min(CHUNK_BYTES, remaining))
                if not chunk:
                    raise tarfile.ReadError("unexpected end of data")
                if self.budget is not None:
                    self.budget.wrote(len(chunk), tarinfo.name)
                if self.deadline is not None:
                    self.deadline.check()
                target.write(chunk)
                remaining -= len(chunk)


class _Stream:
    """The tar stream as tarfile reads it (decompressed), no longer than ``limit`` bytes (None: any length), checking
    ``deadline`` at each read: with an API caller's archive, the limits hold while tarfile reads, before it keeps
    anything in memory (see :data:`TAR_MEMBER_OVERHEAD_BYTES`).

    Raises (from read and seek):
        ArchiveError: the stream goes on past ``limit``.
        FetchDeadlineError: the deadline passed.
    """

    def __init__(self, raw: BinaryIO, display: str, limit: Optional[int], deadline: Optional[FetchDeadline],
                 why: str) -> None:
        self.raw = raw
        self.name = getattr(raw, "name", None) if isinstance(getattr(raw, "name", None), str) else None
        self.mode = "rb"
        self.display = display
        self.limit = limit
        self.deadline = deadline
        self.why = why

    def _long(self, at: int) -> ArchiveError:
        return ArchiveError(f"the weights archive {self.display} is longer than its members can be: its tar stream "
                            f"goes on past byte {self.limit} ({self.why}); refusing to unpack it")

    def read(self, size: int = -1) -> bytes:
        if self.deadline is not None:
            self.deadline.check()
        if self.limit is None:
            return self.raw.read(size)
        left = self.limit - self.raw.tell()
        if size is None or size < 0 or size > left:  # read no more than allowed, then see whether there is more
            data = self.raw.read(max(left, 0))
            if self.raw.read(1):
                raise self._long(self.raw.tell())
            return data
        return self.raw.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if self.deadline is not None:
            self.deadline.check()
        if self.limit is not None and whence == os.SEEK_SET and offset > self.limit:
            raise self._long(offset)
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()


def _decompressed(archive: Path, compression: Optional[str]) -> BinaryIO:
    """``archive`` opened for reading through its decompressor (none for a plain tar)."""
    if compression == "gzip":
        return gzip.GzipFile(archive, "rb")
    if compression == "bzip2":
        return bz2.BZ2File(archive, "rb")
    if compression == "xz":
        return lzma.LZMAFile(archive, "rb")
    return open(archive, "rb")


def extract_archive(archive: Path, staging: Path, display: str, max_extracted_bytes: Optional[int] = None,
                    *, allow_zip: bool = False, max_members: Optional[int] = None, members_setting: str = "",
                    limit_reason: Optional[str] = None, deadline: Optional[FetchDeadline] = None) -> None:
    """Unpack the tar archive ``archive`` (or, with ``allow_zip``, zip archive) into the empty folder ``staging``
    under the member rules and byte budget of the package docstring (:mod:`cog_triton.weights`).

    Args:
        display: the archive as shown in messages.
        max_extracted_bytes: most bytes it may unpack to; None: automatic (:data:`EXTRACT_RATIO` times its size, at
            least :data:`EXTRACT_FLOOR_BYTES`, tightened by its own manifest.json).
        max_members: most members (files, folders, links) it may have, counted before anything is written (an
            archive an API caller gave); its tar stream is then held to the bytes those members can take
            (:data:`TAR_MEMBER_OVERHEAD_BYTES`), its zip central directory to :data:`ZIP_DIRECTORY_BYTES_PER_MEMBER`
            per member. None: no limit (the operator's own weights). ``members_setting`` names it in messages.
        limit_reason: why ``max_extracted_bytes`` is what it is, and how to raise it, for the message refusing an
            archive over it (default: COG_TRITON_MAX_EXTRACTED_BYTES).
        deadline: the fetch's deadline, checked as the archive is read and each member written (None: unpacking is
            bounded by the byte limits only).

    Raises:
        ArchiveError: not a supported archive, corrupt or truncated, over the byte budget or the member limit, or a
            member is unsafe.
        FetchDeadlineError: the deadline passed while unpacking (a WeightsError).
        WeightsError: not enough free disk space, or the files could not be written.
    """
    with open(archive, "rb") as fh:
        head = fh.read(tarfile.BLOCKSIZE)
    if not head:
        raise ArchiveError(f"the weights archive {display} is empty (0 bytes); expected a {SUPPORTED_KINDS}")
    size = archive.stat().st_size
    budget = _Budget.for_archive(display, staging, size, max_extracted_bytes, limit_reason)
    try:
        if allow_zip and head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
            _extract_zip(archive, staging, display, budget, max_members, members_setting, deadline)
        else:
            _extract_tar_archive(archive, head, size, staging, display, budget, max_members, members_setting,
                                 deadline)
    except FetchDeadlineError as exc:
        raise FetchDeadlineError(f"{exc.message}: it passed while the archive was being unpacked") from None


def _extract_tar_archive(archive: Path, head: bytes, size: int, staging: Path, display: str, budget: _Budget,
                         max_members: Optional[int], members_setting: str, deadline: Optional[FetchDeadline]) -> None:
    """:func:`extract_archive` of anything but a zip archive: checked for its kind, then unpacked as a tar archive
    through its decompressor."""
    for magic, what in _UNSUPPORTED_MAGIC:
        if head.startswith(magic):
            raise ArchiveError(f"the weights file {display} is {what}, not a tar archive; supported: {SUPPORTED_KINDS}")
    compression = next((name for magic, name in _COMPRESSION_MAGIC if head.startswith(magic)), None)
    # the unpacked files take at least about the archive's size (less its tar headers)
    check_free_space(staging, min(size - size // 100, budget.limit), f"unpacking {display} ({size} bytes)")
    limit = None
    if max_members is not None:
        limit = budget.limit + max_members * TAR_MEMBER_OVERHEAD_BYTES + TAR_END_BYTES
    why = (f"{budget.limit} bytes of files ({budget.reason}) in at most {max_members} members "
           f"({members_setting or 'the member limit'})")
    try:
        raw = _decompressed(archive, compression)
    except OSError as exc:
        raise WeightsError(f"could not read {display}: {exc}") from exc
    with raw:
        _extract_tar(_Stream(raw, display, limit, deadline, why), staging, display, budget, compression, max_members,
                     members_setting, deadline)


def _extract_tar(stream: _Stream, staging: Path, display: str, budget: _Budget, compression: Optional[str],
                 max_members: Optional[int], members_setting: str, deadline: Optional[FetchDeadline]) -> None:
    """:func:`extract_archive` of a tar archive read from ``stream`` (decompressed)."""
    try:
        tar = _SafeTarFile.open(fileobj=stream, mode="r:")  # type: ignore[arg-type]
    except WeightsError:
        raise
    except (tarfile.ReadError, tarfile.CompressionError, EOFError, zlib.error, lzma.LZMAError, OSError) as exc:
        if compression is not None:
            raise _corrupt(display, f"{compression} data without a readable tar archive inside") from exc
        raise ArchiveError(
            f"the weights file {display} is not a tar archive (nor a gzip/bzip2/xz-compressed one), or it is "
            f"corrupt or truncated; supported: {SUPPORTED_KINDS}"
        ) from exc
    dest = os.path.realpath(staging)
    try:
        with tar:
            tar.errorlevel = 1
            tar.budget = budget
            tar.deadline = deadline
            if max_members is not None:
                _count_tar_members(tar, display, budget, max_members, members_setting, deadline)
            members = _checked_members(tar, dest, display, budget, deadline)
            if _HAS_DATA_FILTER:  # the same rules as _SafeTarFile's, checked twice where Python has them
                tar.extractall(staging, members=members, filter="data")
            else:  # Python < 3.10.12 / 3.11.4: _checked_members and _SafeTarFile are the guards
                tar.extractall(staging, members=members)
            _check_archive_end(tar, display)
    except WeightsError:
        raise
    except _FILTER_ERRORS as exc:
        member = getattr(exc, "tarinfo", None)
        name = member.name if member is not None else "?"
        raise ArchiveError(f"unsafe weights archive {display}: member {_show(name)} was refused: {exc}") from exc
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
        raise _corrupt(display, exc) from exc
    except KeyError as exc:  # a hard link to a member that is not in the archive
        raise ArchiveError(f"the weights archive {display} has a hard link to a missing member: {exc}") from exc
    except RecursionError:  # not expected with members at most MAX_MEMBER_DEPTH deep; never a bare one
        raise ArchiveError(f"the weights archive {display} nests folders too deeply to unpack") from None
    except OSError as exc:
        if exc.errno is None:  # decompressor errors (bz2 "Invalid data stream", ...) carry no errno
            raise _corrupt(display, exc) from exc
        raise WeightsError(f"could not unpack {display} into {staging}: {exc}") from exc


def _too_many(display: str, max_members: int, members_setting: str) -> ArchiveError:
    setting = f" ({members_setting})" if members_setting else ""
    return ArchiveError(f"the weights archive {display} has more than the {max_members} members allowed{setting}; "
                        "refusing to unpack it (nothing was written)")


def _count_tar_members(tar: tarfile.TarFile, display: str, budget: _Budget, max_members: int,
                       members_setting: str, deadline: Optional[FetchDeadline]) -> None:
    """Read every member's header (tarfile keeps them for the extraction that follows) before anything is written:
    refuse more than ``max_members``, or regular members declaring more bytes than the budget, at the first member
    beyond either.

    Raises:
        ArchiveError: too many members, or too many bytes declared.
        FetchDeadlineError: the deadline passed.
    """
    count, declared = 0, 0
    while True:
        if deadline is not None:
            deadline.check()
        member = tar.next()
        if member is None:
            return
        count += 1
        if count > max_members:
            raise _too_many(display, max_members, members_setting)
        if member.isreg():
            declared += member.size
            if declared > budget.limit:
                raise budget._over(f"its members declare {declared} bytes (up to and including "
                                   f"{_show(member.name)}); nothing was written")
def _zip_directory(archive: Path) -> Optional[tuple[int, int]]:
    """(entries, bytes) of the zip archive's central directory as its end record states them (PKWARE's APPNOTE.TXT
    4.3.16, and 4.3.14-4.3.15 for zip64), or None where there is no end record (zipfile then refuses the archive).
    Read before zipfile parses the directory, so that a huge one is refused first."""
    with open(archive, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        tail_start = max(0, size - (22 + 0xFFFF))
        fh.seek(tail_start)
        tail = fh.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < 22:
            return None
        entries, directory = struct.unpack_from("<HL", tail, at + 10)
        locator = at - 20
        if locator >= 0 and tail[locator:locator + 4] == b"PK\x06\x07":  # zip64: the counts are in its end record
            (record,) = struct.unpack_from("<Q", tail, locator + 8)
            fh.seek(record)
            zip64 = fh.read(56)
            if len(zip64) == 56 and zip64[:4] == b"PK\x06\x06":
                entries, directory = struct.unpack_from("<QQ", zip64, 32)
        return entries, directory


def _extract_zip(archive: Path, staging: Path, display: str, budget: _Budget, max_members: Optional[int],
                 members_setting: str, deadline: Optional[FetchDeadline]) -> None:
    """Unpack a zip archive by the rules of :func:`_member_problem` (paths, depth, no links), counting bytes; with
    ``max_members``, its central directory's stated size and then its entries are counted before anything is read
    or written."""
    dest = os.path.realpath(staging)
    if max_members is not None:
        stated = _zip_directory(archive)
        if stated is not None and (stated[0] > max_members
                                   or stated[1] > max_members * ZIP_DIRECTORY_BYTES_PER_MEMBER):
            raise _too_many(display, max_members, members_setting)
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            if max_members is not None and len(infos) > max_members:
                raise _too_many(display, max_members, members_setting)
            if max_members is not None:
                declared = sum(info.file_size for info in infos if not info.is_dir())
                if declared > budget.limit:
                    raise budget._over(f"its members declare {declared} bytes; nothing was written")
            for info in infos:
                if deadline is not None:
                    deadline.check()
                name = info.filename
                mode = info.external_attr >> 16
                problem = _member_problem(_zip_as_tar(info), dest)
                if problem is None and stat.S_ISLNK(mode):
                    problem = "is a symlink, which zip archives may not hold here"
                if problem is not None:
                    raise ArchiveError(
                        f"unsafe archive {display}: member {_show(name)} {problem}; refusing to unpack it "
                        "(nothing was written outside the target directory)"
                    )
                target = staging / name
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                if PurePosixPath(name).name == VERIFIED_NAME:
                    continue
                budget.declare_bytes(name, info.file_size)
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as source, open(target, "wb") as out:
                    while chunk := source.read(CHUNK_BYTES):
                        if deadline is not None:
                            deadline.check()
                        budget.wrote(len(chunk), name)
                        out.write(chunk)
                os.chmod(target, 0o644)
    except WeightsError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, lzma.LZMAError, NotImplementedError) as exc:
        raise _corrupt(display, exc) from exc
    except OSError as exc:
        raise WeightsError(f"could not unpack {display} into {staging}: {exc}") from exc


def _zip_as_tar(info: zipfile.ZipInfo) -> tarfile.TarInfo:
    """A zip member as the TarInfo that :func:`_member_problem` checks (a directory or a regular file)."""
    member = tarfile.TarInfo(info.filename.rstrip("/") if info.is_dir() else info.filename)
    member.type = tarfile.DIRTYPE if info.is_dir() else tarfile.REGTYPE
    member.size = info.file_size
    return member


def _checked_members(
    tar: tarfile.TarFile, dest: str, display: str, budget: _Budget, deadline: Optional[FetchDeadline] = None
) -> Iterator[tarfile.TarInfo]:
    """Yield the members of ``tar`` one by one, each checked just before it is extracted (and ``deadline`` with it).

    A generator: extractall unpacks each member before asking for the next, so a manifest.json
    yielded here has been written when the loop comes back, and can tighten ``budget``.
    """
    manifest: Optional[tarfile.TarInfo] = None
    for member in tar:
        if deadline is not None:
            deadline.check()
        if manifest is not None:
            budget.apply_manifest(manifest)
            manifest = None
        problem = _member_problem(member, dest)
        if problem is not None:
            raise ArchiveError(
                f"unsafe weights archive {display}: member {_show(member.name)} {problem}; refusing to unpack it "
                "(nothing was written outside the target directory)"
            )
        if PurePosixPath(member.name).name == VERIFIED_NAME:
            log.warning("skipping %s in %s: verification records are only trusted when written on this machine",
                        _show(member.name), display)
            continue
        if member.isreg():
            budget.declare(member)
            parts = PurePosixPath(member.name).parts
            if (not budget.manifest_seen and parts[-1] == MANIFEST_NAME and len(parts) <= 2
                    and member.size <= MANIFEST_MAX_BYTES):
                manifest = member
        yield member
    if manifest is not None:
        budget.apply_manifest(manifest)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _member_problem(member: tarfile.TarInfo, dest: str) -> Optional[str]:
    """Why ``member`` must not be extracted into the real directory ``dest``, or None when it is safe."""
    name = member.name
    if not name or "\x00" in name:
        return "has an empty or invalid name"
    depth = len(PurePosixPath(name).parts)
    if depth > MAX_MEMBER_DEPTH:
        return f"is nested {depth} path components deep, more than the {MAX_MEMBER_DEPTH} allowed"
    length = len(name.encode("utf-8", "surrogateescape"))
    if length > MAX_MEMBER_PATH_BYTES:
        return f"has a path {length} bytes long, more than {MAX_MEMBER_PATH_BYTES} allowed"
    if name.startswith(("/", "\\")) or os.path.isabs(name) or PureWindowsPath(name).drive:
        return "has an absolute path"
    if ".." in PurePosixPath(name).parts or ".." in PureWindowsPath(name).parts:
        return "has a '..' path component"
    if member.ischr() or member.isblk():
        return "is a device file"
    if member.isfifo():
        return "is a FIFO (named pipe)"
    if member.issparse():
        return "is a sparse file, which is not supported; pack the archive without --sparse"
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return f"has the unsupported tar member type {member.type!r}"
    if not _within(os.path.realpath(os.path.join(dest, name)), dest):
        return "would be written outside the target directory (through a symlink)"
    if member.issym() or member.islnk():
        what = "symlink" if member.issym() else "hard link"
        link = member.linkname
        if not link:
            return f"is a {what} with an empty target"
        if len(link.encode("utf-8", "surrogateescape")) > MAX_MEMBER_PATH_BYTES:
            return f"is a {what} to a path longer than {MAX_MEMBER_PATH_BYTES} bytes"
        if link.startswith(("/", "\\")) or os.path.isabs(link):
            return f"is a {what} to the absolute path {_show(link)} (outside the target directory)"
        base = posixpath.dirname(name) if member.issym() else ""
        lexical = posixpath.normpath(posixpath.join(base, link))
        resolved = os.path.realpath(os.path.join(dest, base, link))
        if lexical == ".." or lexical.startswith("../") or not _within(resolved, dest):
            return f"is a {what} to {_show(link)}, which points outside the target directory"
    return None


def _check_archive_end(tar: tarfile.TarFile, display: str) -> None:
    """Fail unless the archive ended with its end-of-archive block and the compressed stream is complete.

    tarfile treats a missing end-of-archive block (a tar cut at a member boundary) as a normal end
    and does not read a gzip stream's trailer; both are signs of truncation.
    """
    fileobj = tar.fileobj
    assert fileobj is not None
    fileobj.seek(tar.offset)  # within the reader's buffer: the block tarfile has just read
    block = fileobj.read(tarfile.BLOCKSIZE)
    if len(block) < tarfile.BLOCKSIZE:
        raise _corrupt(display, f"it ends at byte {tar.offset} of the tar data without the end-of-archive marker")
    if block.count(0) != tarfile.BLOCKSIZE:
        raise _corrupt(display, f"unreadable tar header at byte {tar.offset} of the tar data")
    _drain(fileobj)


def _drain(fileobj: BinaryIO) -> None:
    while fileobj.read(CHUNK_BYTES):
        pass
