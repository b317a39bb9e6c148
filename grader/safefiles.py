"""Files and folders the grader keeps, writes and reads back, on a machine other users share.

Two rules (docs/security.md, "What the grader keeps and reads back"):

- A folder the grader executes, imports or writes from (the kept cache, the warm judge's folder)
  is `trusted_folder`: every folder on its path is one only its owner (root or this user) may
  change, or a sticky one (/tmp) whose entry below is root's or ours, all the way down; the
  folder itself is ours, 0700. Who may write is read from the mode bits and the POSIX ACLs
  (access and default): a named user or group, or a group that is not the owner's private one,
  with write counts as another user; ACLs that cannot be read are refused, not guessed. Anything
  else is refused with the reason and the fix: another user who may rename, replace or link a
  folder on the way may swap in their own code. Once a path passes, nobody but root and this
  user can change what it leads to. A folder the grader makes (`make_folder`) inherits no ACL
  and gets its mode on its descriptor.
- What the grader reads back (a worker's outputs, a kept hint, a record, a log) is input:
  `open_plain` opens it without following a link, never blocking (a FIFO), nothing but a
  regular file; `read_plain` reads it bounded. What the grader writes into a kept folder is
  written by `write_atomic`, relative to the folder's descriptor, into a file it creates
  (never one that was there: no link followed).
"""

from __future__ import annotations

import errno
import functools
import grp
import os
import pwd
import stat
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40  # links followed on a folder's path, as the kernel's own limit


class UnsafeFolderError(Exception):
    """A folder another user can change: one line with the reason and the fix (exit 2)."""


class UnsafeFileError(OSError):
    """A file read back that is not one: a link, a FIFO, a device, a folder, too large, or gone.
    One line that says which; never a hang."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def _own_group(gid: int, uid: int | None = None) -> bool:
    """Whether group `gid` is user `uid`'s alone (this user by default; a user private group:
    the user's primary group, named as the user, with no other member): its write permission
    gives nobody else a way in."""
    try:
        user = pwd.getpwuid(os.getuid() if uid is None else uid)
        group = grp.getgrgid(gid)
    except (KeyError, OSError):
        return False
    return (gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}
            and _primary_of(gid) <= {user.pw_name})


@functools.lru_cache(maxsize=64)
def _primary_of(gid: int) -> frozenset[str]:
    """The users whose primary group is `gid` (they are in it without being named as members)."""
    return frozenset(user.pw_name for user in pwd.getpwall() if user.pw_gid == gid)


ACL_ACCESS, ACL_DEFAULT = "system.posix_acl_access", "system.posix_acl_default"
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ACL = {errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP}


class UnreadableAclError(OSError):
    """The ACLs of a folder on a trusted path cannot be read: refused rather than guessed."""


def _acl_entries(fd: int, name: str) -> list[tuple[int, int, int]]:
    """The (tag, perm, id) entries of ACL `name` (the kernel's xattr form: a u32 version 2,
    then entries of u16 tag, u16 perm, u32 id, little-endian); [] where there is none or the
    file system keeps none. UnreadableAclError for any other error or a malformed one."""
    try:
        raw = os.getxattr(fd, name)
    except OSError as exc:
        if exc.errno in _NO_ACL:
            return []
        raise UnreadableAclError(exc.errno, f"its ACL cannot be read ({os.strerror(exc.errno or 0)})") from None
    if len(raw) < 4 or (len(raw) - 4) % 8 or int.from_bytes(raw[:4], "little") != _ACL_VERSION:
        raise UnreadableAclError(errno.EINVAL, "its ACL is in a form the grader does not know")
    return [(int.from_bytes(raw[i:i + 2], "little"), int.from_bytes(raw[i + 2:i + 4], "little"),
             int.from_bytes(raw[i + 4:i + 8], "little")) for i in range(4, len(raw), 8)]


def acl_grants_others_write(fd: int, st: os.stat_result) -> bool | None:
    """Whether an ACL on `fd` (its access ACL, or the default one every file made in it
    inherits) grants write to a user other than the owner and root: a named user, a named
    group or the owning group that is not the owner's private one, or everyone. The access
    ACL's mask limits what its named and group entries grant; a default ACL is counted whole
    (its mask may be widened by whoever owns what is made in it). None where there is no ACL
    at all (the mode bits say it all)."""
    found = False
    for name in (ACL_ACCESS, ACL_DEFAULT):
        entries = _acl_entries(fd, name)
        found = found or bool(entries)
        mask = next((perm for tag, perm, _ in entries if tag == _MASK), 7) if name == ACL_ACCESS else 7
        for tag, perm, ident in entries:
            if tag in (_USER, _GROUP, _GROUP_OBJ) and not perm & mask & 2 or tag != _OTHER and not perm & 2:
                continue
            if tag == _USER and ident not in (0, st.st_uid):
                return True
            if tag == _GROUP and not _own_group(ident, st.st_uid):
                return True
            if tag == _GROUP_OBJ and not _own_group(st.st_gid, st.st_uid):
                return True
            if tag == _OTHER and perm & 2:
                return True
    return False if found else None


def others_may_write(st: os.stat_result, fd: int | None = None) -> bool:
    """Whether a user other than the folder's owner (and root) may create, rename or remove in
    it: by its ACLs where `fd` is given and it has any (`acl_grants_others_write`; the mode's
    group bits are then the access ACL's mask), else by its mode bits (write for all, or for a
    group that is not the owner's private one). UnreadableAclError where its ACLs cannot be read."""
    acl = None if fd is None else acl_grants_others_write(fd, st)
    if acl is not None:
        return acl or bool(st.st_mode & stat.S_IWOTH)
    return bool(st.st_mode & stat.S_IWOTH) or bool(st.st_mode & stat.S_IWGRP and not _own_group(st.st_gid, st.st_uid))


def _drop_acls(fd: int) -> None:
    """No ACL left on the folder `fd` (ours): its mode bits alone say who may use it."""
    for acl in (ACL_DEFAULT, ACL_ACCESS):
        try:
            os.removexattr(fd, acl)
        except OSError as exc:
            if exc.errno not in _NO_ACL:
                raise


def make_folder(name: str, mode: int, dir_fd: int) -> int:
    """A descriptor on folder `name`, made now in the folder `dir_fd`: no ACL inherited from the
    folder it is made in (a default ACL there would give its users rights in everything the
    grader makes), its mode set on the descriptor (never by path). FileExistsError where it
    was there."""
    os.mkdir(name, 0o700, dir_fd=dir_fd)
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        _drop_acls(fd)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _who(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


PRIVATE, OWN, SHARED = "private", "own", "shared"


def trusted_folder(path: str | os.PathLike, what: str = "folder", fix: str = "", kind: str = PRIVATE) -> int:
    """A descriptor (O_RDONLY) on folder `path`, made where missing, after checking that no
    other user can change what the path leads to (see the module's docstring); else
    UnsafeFolderError (`what` names the folder, `fix` says how to choose another). OSError: it
    cannot be made or entered (no right, a read-only file system). `kind` says what the folder
    itself must be: PRIVATE (a cache: ours, made 0700 and kept so), OWN (an output folder the
    user chose: ours, nobody else may write in it, its mode left as it is), SHARED (the GPU
    locks every user's grader on the host takes: root's or ours, and sticky where others may
    write in it, as /tmp; made 1777)."""
    trusted = {0, os.getuid()}
    fix = f" ({fix})" if fix else ""
    wanted = Path(os.path.abspath(path))
    parts = list(wanted.parts[1:])
    where = Path("/")
    fd = os.open("/", DIR_FLAGS)
    st = os.fstat(fd)
    hops = 0

    def open_to_others() -> bool:  # of the folder `fd` now is, at `where`
        try:
            return others_may_write(st, fd)
        except UnreadableAclError as exc:
            raise UnsafeFolderError(f"the {what}'s path leads through {where}, and {exc.strerror}: the grader "
                                    f"cannot tell who may write there{fix}") from None

    try:
        if st.st_uid not in trusted:
            raise UnsafeFolderError(f"/ belongs to {_who(st.st_uid)}")
        while parts:
            name = parts.pop(0)
            if name in ("", "."):
                continue
            if name == "..":  # abspath left none, but a link's target may hold one
                raise UnsafeFolderError(f"the {what} {wanted} leads through '..' in a link{fix}")
            shared = open_to_others() and not st.st_mode & stat.S_ISVTX
            if shared:  # before anything is made in it
                raise UnsafeFolderError(f"the {what}'s path leads through {where}, where other users may write "
                                        f"({_rights(st, fd)}, not sticky): another user may swap "
                                        f"what lies in it{fix}")
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                hops += 1  # a folder made here, or one made meanwhile by another: opened again and checked
                if hops > MAX_LINKS:
                    raise
                try:
                    made = parts == [] and kind != PRIVATE
                    os.close(make_folder(name, (0o1777 if kind == SHARED else 0o755) if made else 0o700, fd))
                except FileExistsError:
                    pass
                parts.insert(0, name)
                continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                link = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(link.st_mode):
                    raise UnsafeFolderError(f"{where / name} is not a folder{fix}") from None
                hops += 1
                if hops > MAX_LINKS:
                    raise UnsafeFolderError(f"the {what} {wanted} leads through too many links{fix}") from None
                _check_entry(shared, st, link, where / name, trusted, what, fix)
                target = os.readlink(name, dir_fd=fd)
                parts[:0] = list(Path(target).parts)
                if os.path.isabs(target):
                    os.close(fd)
                    fd = os.open("/", DIR_FLAGS)
                    st = os.fstat(fd)
                    where = Path("/")
                    parts.pop(0)
                continue
            child_st = os.fstat(child)
            try:
                _check_entry(shared, st, child_st, where / name, trusted, what, fix)
            except UnsafeFolderError:
                os.close(child)
                raise
            os.close(fd)
            fd, st, where = child, child_st, where / name
        if st.st_uid != os.getuid() and not (kind == SHARED and st.st_uid == 0):
            raise UnsafeFolderError(f"the {what} {wanted} belongs to {_who(st.st_uid)}, not to you{fix}")
        if kind == PRIVATE:  # ours: made private again, any ACL on it removed
            _drop_acls(fd)
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o700)
        elif kind != PRIVATE and open_to_others() and not (kind == SHARED and st.st_mode & stat.S_ISVTX):
            raise UnsafeFolderError(f"other users may write in the {what} {wanted} ("
                                    f"{_rights(st, fd)}{'' if kind == OWN else ', not sticky'}): "
                                    f"another user may swap what the grader writes there{fix}")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _rights(st: os.stat_result, fd: int) -> str:
    """How others may write in a folder, for the message: its mode, and its ACL where one says so."""
    try:
        acl = bool(acl_grants_others_write(fd, st))
    except UnreadableAclError:
        acl = False
    return f"mode {stat.S_IMODE(st.st_mode):o}" + (", an ACL entry grants others write" if acl else "")


def _check_entry(shared: bool, parent: os.stat_result, entry: os.stat_result, path: Path, trusted: set[int],
                 what: str, fix: str) -> None:
    """`entry` (a folder or a link) in `parent` is one no other user can change or swap
    (`shared`: others may write in `parent`, not sticky)."""
    if entry.st_uid not in trusted:
        raise UnsafeFolderError(f"the {what}'s path leads through {path}, which belongs to {_who(entry.st_uid)}: "
                                f"that user may put anything in its place{fix}")
    if shared:
        raise UnsafeFolderError(f"the {what}'s path leads through {path}, in {path.parent} where other users may "
                                f"write (mode {stat.S_IMODE(parent.st_mode):o}, not sticky): another user may swap "
                                f"it{fix}")


def open_plain(name: str | os.PathLike, dir_fd: int | None = None) -> int:
    """A descriptor on a regular file read back: never through a link (the grader may hold more
    rights than whoever wrote it: a link to /etc/shadow must not work), never blocking (a FIFO
    with no writer, a file under a lease), never anything but a regular file (a FIFO, /dev/zero,
    a socket, a folder). Its folder is opened the same way, so a link in place of the folder
    leads nowhere either."""
    path = Path(name)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        folder = os.open(path.parent, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise UnsafeFileError(exc.errno,
                              f"{path.parent.name}/ is not a plain folder ({os.strerror(exc.errno or 0)})") from None
    try:
        fd = os.open(path.name, flags, dir_fd=folder)
    except OSError as exc:
        why = {errno.ELOOP: "a symbolic link",
               errno.EWOULDBLOCK: "held by a lease"}.get(exc.errno or 0, os.strerror(exc.errno or 0))
        raise UnsafeFileError(exc.errno, f"{path.name} cannot be read: {why}") from None
    finally:
        os.close(folder)
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        what = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket",
                stat.S_IFDIR: "a folder"}.get(kind, "not a regular file")
        raise UnsafeFileError(errno.EINVAL, f"{path.name} is {what}, not a regular file")
    return fd


def read_plain(name: str | os.PathLike, limit: int, dir_fd: int | None = None) -> bytes:
    """The bytes of a regular file (see `open_plain`), at most `limit` of them: a larger file is
    refused, not read (it may grow while read: what is read is bounded too)."""
    fd = open_plain(name, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        if os.fstat(fd).st_size > limit:
            raise UnsafeFileError(errno.EFBIG, f"{Path(name).name} is larger than {limit} bytes")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFileError(errno.EFBIG, f"{Path(name).name} is larger than {limit} bytes")
    return data


def write_atomic(dir_fd: int, name: str, data: bytes) -> None:
    """`name` in the folder `dir_fd` holds `data`, replaced at once (a reader never sees half of
    it): written to a file this call creates (O_EXCL: never one that was there, nor a link's
    target), then renamed over `name` in the same folder. OSError (a full disk) leaves `name`
    as it was."""
    tmp = f".{name}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except FileExistsError:  # left by a process of ours that died: ours to remove (the folder is ours alone)
        os.unlink(tmp, dir_fd=dir_fd)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a crash leaves the old file or the new one
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def peer_uid(sock) -> int:
    """The uid of the process at the other end of a connected Unix socket (SO_PEERCRED), -1
    where it cannot be told: every client checks it is its own user's before it sends anything
    (a socket planted by another user would receive what is sent), every server before it serves."""
    import socket
    import struct

    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return -1
    return struct.unpack("3i", creds)[1]
