/* Protected names, not made: the command cannot create `.codex`, `.mcp.json`, `.envrc`, … (the
 * policy's filesystem.protected, less `.git` and `.gitmodules`, which git makes: init.py's
 * GIT_MAKES) in a write root during
 * its run, at any depth, by any call that makes a name. Nor, in one directory only, what of
 * the home runs code on the host (`~/.config/git`, `~/.local/bin`, `~/.vimrc`, ...: an entry
 * "directory/name", launch/homecode.py; "directory/.*": any name starting with "." there, for
 * a home a write root holds), the directory known by its inode (pinned by the view, it cannot
 * be renamed away).
 *
 * Threat. A name present at launch is re-mounted read-only (protect.py), but one made during
 * the run is an ordinary file a host tool trusts later: an agent's configuration, an MCP
 * server, editor tasks, a shell's start-up file. Every call that makes a name is a way:
 * mkdir, open/openat/creat with O_CREAT, mknod, symlink, link, rename (the new name; both
 * names of RENAME_EXCHANGE). openat2 takes its flags in a struct no filter can read, and
 * Stockade's filter answers it ENOSYS (callers fall back to openat); io_uring is refused.
 *
 * Races. Checking the caller's path and letting the kernel go on
 * (SECCOMP_USER_NOTIF_FLAG_CONTINUE) decides nothing: the kernel reads the path again from
 * memory another thread may have rewritten, follows a last component that is a dangling
 * symlink (`x -> .codex` makes open("x", O_CREAT) create `.codex`), and resolves directories
 * that may have been renamed meanwhile. So no such call ever continues. The filter the command
 * gets before its exec (memwatch.c's: the kernel gives a process one listener) hands each of
 * them to pid 1, which reads the path once
 * into its own memory, finds the directory the last component is in as the caller would
 * (from the caller's working directory or descriptor, through /proc/<tid>; component by
 * component, /proc/self meaning the caller: memwatch.c's caller_resolve), judges that last
 * component, and makes the name itself in that directory with the *at call on its own copy:
 * what it judged is what it makes. An open whose last component is a symlink is followed by
 * pid 1 from the link's text, so the name finally made is judged too; procfs's magic links
 * (/dev/stdout, /proc/self/fd/N) are followed by the kernel, as the caller's: they lead to an
 * existing file, never to a new name. A made file's descriptor goes to the caller as the
 * call's answer (SECCOMP_IOCTL_NOTIF_ADDFD, then the answer once pid 1's copy is closed).
 *
 * Rights. pid 1 holds no capability, has the command's uid and gids, and its Landlock domain
 * is the command's (the command's own nested domain handles nothing pid 1's does not deny
 * anyway) and its seccomp deny list the same: what it makes, the command could. The caller's
 * umask (from its /proc/<tid>/status) is set for each call. The filter is installed with
 * SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, so a signal cannot make the kernel restart a call
 * pid 1 has already carried out. A caller whose memory pid 1 cannot read (it made itself
 * non-dumpable) is answered EACCES: nothing it names can be judged. pid 1 is out of the
 * command's reach (not dumpable, Landlock-scoped); were it gone, so would be the sandbox.
 *
 * Where. A protected name may not be made anywhere but on the sandbox's own /tmp and
 * /dev/shm (fresh, private, gone with it): in a write root (a direct mount or an overlay, a
 * pinned directory's mount too) it is refused EACCES, recorded as a `filesystem.protected`
 * violation naming the directory, the name and the call (at most EVENTS_RECORDED in
 * EVENT_WINDOW seconds, supervisor.h; then that more were refused), released by "!NAME"; in read-only places the kernel would refuse anyway.
 * An open with O_CREAT of a protected name that exists (a read-only mount's) opens it
 * without O_CREAT: only a new name is refused. Names match without regard to ASCII case (a
 * case-folding filesystem's `.CODEX` is `.codex`).
 *
 * Blocking. pid 1 never waits on what the command controls: while it waits it answers no
 * call and watches no lifeline. A fifo opened without O_NONBLOCK waits for its other end: one
 * is opened by a child of pid 1, which answers the call when the open returns; everything
 * else is opened non-blocking (then made blocking again), and what answers ENXIO (a fifo made
 * or swapped in meanwhile with no reader) or EWOULDBLOCK (a file under another's lease) goes
 * to a child too. So are the opens the kernel decides (procfs's magic links, which may lead
 * to a fifo or a device, ".", "..", O_TMPFILE); an O_PATH open waits for nothing.
 *
 * Cost. Only creating calls are trapped (an openat without O_CREAT is not: the filter tests
 * the flag); each costs a round trip to pid 1 and a walk of its path, tens of microseconds,
 * and they are answered one at a time (a slow filesystem delays the others' calls).
 *
 * Not covered, said in SECURITY.md: bind(2) of a unix socket makes a name too (a socket file,
 * which no host tool runs), and non-ASCII spellings that a case-folding filesystem would fold
 * onto a protected name.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/magic.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "supervisor.h"

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

enum { FREE_MAX = 4, LINKS_MAX = 40 };

/* A name not to be made in one directory only (an entry "directory/name" of the names): the
 * home's code (launch/homecode.py), known by the directory's inode, which the view pins. */
struct placed {
    dev_t dev;
    ino_t ino;
    const char *name, *entry;
};

struct namewatch {
    int listener;
    const char *names;
    uint32_t names_size;
    struct placed *placed;
    size_t placed_count;
    uint64_t free[FREE_MAX];            /* mount ids where protected names may be made */
    int free_count;
    struct budget recorded, git_recorded;  /* the records of each kind written */
    unsigned unrecorded;                /* refusals whose event the status pipe had no room for */
    struct seccomp_notif_resp *response;
    size_t response_size;
};

/* Calls that make a name whatever their flags; open and openat only with O_CREAT (memwatch.c's
 * filter tests the flag). */
const int NAMEWATCH_CALLS[] = {
    __NR_mkdirat, __NR_mknodat, __NR_symlinkat, __NR_linkat, __NR_renameat2,
#ifdef __NR_renameat
    __NR_renameat,
#endif
#ifdef __NR_mkdir
    __NR_mkdir, __NR_mknod, __NR_symlink, __NR_link, __NR_rename, __NR_creat,
#endif
};
const int NAMEWATCH_CALL_COUNT = sizeof NAMEWATCH_CALLS / sizeof *NAMEWATCH_CALLS;

int namewatch_traps(int nr) {
    for (int i = 0; i < NAMEWATCH_CALL_COUNT; i++)
        if (NAMEWATCH_CALLS[i] == nr)
            return 1;
#ifdef __NR_open
    if (nr == __NR_open)
        return 1;
#endif
    return nr == __NR_openat;
}

/* ---- where a name would be made ---- */

struct place {
    int parent;                  /* O_PATH: the directory the last component is in */
    char name[PATH_MAX];         /* the last component as given (trailing slashes kept) */
    char last[NAME_MAX + 1];     /* it without them: what is judged */
};

static int on_proc(int fd) {
    struct statfs where;
    return fstatfs(fd, &where) == 0 && where.f_type == PROC_SUPER_MAGIC;
}

/* Find `path` from `base` (consumed) as task `tid` would, all but its last component; 0 or
 * -errno. */
static int find_place(uint32_t tid, int base, const char *path, struct place *out) {
    size_t end = strlen(path), start;
    out->parent = -1;
    if (end == 0) {
        close(base);
        return -ENOENT;
    }
    while (end > 0 && path[end - 1] == '/')
        end--;
    for (start = end; start > 0 && path[start - 1] != '/';)
        start--;
    if (end - start > NAME_MAX || strlen(path + start) >= sizeof out->name) {
        close(base);
        return -ENAMETOOLONG;
    }
    if (end == 0) {  /* "/" (or "//"): the root itself */
        strcpy(out->last, ".");
        strcpy(out->name, ".");
        start = 1;
    } else {
        memcpy(out->last, path + start, end - start);
        out->last[end - start] = 0;
        strcpy(out->name, path + start);
    }
    if (start == 0) {
        out->parent = base;
    } else {
        char head[PATH_MAX];
        memcpy(head, path, start);
        head[start] = 0;
        out->parent = caller_resolve(tid, base, head);
        if (out->parent < 0)
            return -errno;
    }
    if (on_proc(out->parent)
        && (strcmp(out->last, "self") == 0 || strcmp(out->last, "thread-self") == 0)) {
        snprintf(out->last, sizeof out->last, "%u", tid);
        snprintf(out->name, sizeof out->name, "%u", tid);
    }
    /* (the last component's lookup, which pid 1 makes itself: in /proc/1 its own) */
    return another_process(tid, out->parent, out->last) ? -EACCES : 0;
}

static int place_from(uint32_t tid, int dir, const char *path, struct place *out) {
    int base = caller_dir(tid, dir);
    if (base < 0) {
        out->parent = -1;
        return -errno;
    }
    return find_place(tid, base, path, out);
}

static void leave(struct place *p) {
    if (p->parent >= 0)
        close(p->parent);
    p->parent = -1;
}

/* Whether `name` is hidden (a placed entry ".*" matches it): "." and ".." are no new name. */
static int hidden(const char *name) {
    return name[0] == '.' && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* The protected name `p` would make (as the policy spells it; a placed one's whole entry), or
 * NULL. */
static const char *protected_name(const struct namewatch *w, const struct place *p) {
    const char *found = NULL;
    for (const char *n = w->names; n < w->names + w->names_size; n += strlen(n) + 1)
        if (!strchr(n, '/') && strcasecmp(n, p->last) == 0)
            found = n;
    struct stat directory;
    if (!found && w->placed_count > 0 && fstat(p->parent, &directory) == 0)
        for (size_t i = 0; i < w->placed_count; i++)
            if (w->placed[i].dev == directory.st_dev && w->placed[i].ino == directory.st_ino
                && (strcmp(w->placed[i].name, ".*") == 0 ? hidden(p->last)
                    : strcasecmp(w->placed[i].name, p->last) == 0))
                return w->placed[i].entry;
    if (!found)
        return NULL;
    struct statx info;
    if (statx(p->parent, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_MNT_ID, &info) != 0
        || !(info.stx_mask & STATX_MNT_ID))
        return found;
    for (int i = 0; i < w->free_count; i++)
        if (w->free[i] == info.stx_mnt_id)
            return NULL;
    return found;
}

/* One event line: `kind`, then (key, string value) pairs, `count` strings in all; within
 * PIPE_BUF, written only if the status pipe has room for it (pid 1 does not wait for its
 * owner; a lost one is counted in the exit event): a "directory" too long for that (a control
 * byte is escaped in six) is cut to its end, after "...". */
static void emit_fields(struct namewatch *w, const char *kind, const char *const *fields,
                        size_t count) {
    const char *directory = "";
    for (size_t i = 0; i + 1 < count; i += 2)
        if (strcmp(fields[i], "directory") == 0)
            directory = fields[i + 1];
    size_t length = strlen(directory);
    char cut[1024 + 3];
    struct text event = {0};
    for (size_t kept = length;; kept /= 2) {
        snprintf(cut, sizeof cut, "%s%s", kept < length ? "..." : "", directory + length - kept);
        put(&event, "{\"event\": ", strlen("{\"event\": "));
        put_string(&event, kind);
        for (size_t i = 0; i + 1 < count; i += 2) {
            put(&event, ", ", 2);
            put_string(&event, fields[i]);
            put(&event, ": ", 2);
            put_string(&event, strcmp(fields[i], "directory") == 0 ? cut : fields[i + 1]);
        }
        put(&event, "}", 1);
        if (event.size < PIPE_BUF || kept == 0)  /* (< : and its newline) */
            break;
        free(event.data);
        event = (struct text){0};
    }
    w->unrecorded += emit_event_unwaiting(&event) != 0;
}

/* The directory `p`'s last component is in, as the sandbox names it (`where`: 1024 bytes). */
static void directory_of(const struct place *p, char *where) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", p->parent);
    ssize_t size = readlink(link, where, 1023);
    where[size > 0 ? size : 0] = 0;
}

/* A `filesystem.protected` violation: `call` did not make `name` in `p`'s directory. */
static void record(struct namewatch *w, const struct place *p, const char *name,
                   const char *call) {
    unsigned before = budget_next(&w->recorded);
    if (before > EVENTS_RECORDED)
        return;
    if (before == EVENTS_RECORDED) {
        emit_fields(w, "protected_name", (const char *[]){"more", "true"}, 2);
        return;
    }
    char where[1024];
    directory_of(p, where);
    emit_fields(w, "protected_name", (const char *[]){"call", call, "directory", where, "name",
                                                      p->last, "protected", name}, 8);
}

/* Whether `where`/`last` is git's: a `.git` itself, or inside one. */
static int in_git(const char *where, const char *last) {
    size_t size = strlen(where);
    return strcmp(last, ".git") == 0 || strstr(where, "/.git/") != NULL
        || (size >= 5 && strcmp(where + size - 5, "/.git") == 0);
}

/* What `call` answered (`result`) when it wrote `p`: a read-only mount's EROFS, or a mount
 * point's EBUSY (rename onto it), in a `.git` is the git guard's (gitdirs.py), recorded so the
 * result can name filesystem.git: git itself says only "Device or resource busy". */
static int noted(struct namewatch *w, const struct place *p, const char *call, int result) {
    if (result != -EBUSY && result != -EROFS)
        return result;
    char where[1024];
    directory_of(p, where);
    if (!in_git(where, p->last))
        return result;
    unsigned before = budget_next(&w->git_recorded);
    if (before > EVENTS_RECORDED)
        return result;
    if (before == EVENTS_RECORDED)
        emit_fields(w, "git_guarded", (const char *[]){"more", "true"}, 2);
    else
        emit_fields(w, "git_guarded", (const char *[]){"call", call, "directory", where, "name",
                                                       p->last, "error", result == -EBUSY
                                                       ? "EBUSY" : "EROFS"}, 8);
    return result;
}

/* Refuse making a protected name (EACCES, recorded), or 0 when `p` may be made. */
static int judge(struct namewatch *w, const struct place *p, const char *call) {
    const char *name = protected_name(w, p);
    if (!name)
        return 0;
    record(w, p, name, call);
    return -EACCES;
}

/* ---- answering ---- */

static void reply_value(struct namewatch *w, uint64_t id, int result, int64_t value) {
    struct seccomp_notif_resp *answer = w->response;
    memset(answer, 0, w->response_size);
    answer->id = id;
    answer->error = result < 0 ? result : 0;
    answer->val = result < 0 ? 0 : value;
    while (ioctl(w->listener, SECCOMP_IOCTL_NOTIF_SEND, answer) != 0 && errno == EINTR) {
    }
}

static void reply(struct namewatch *w, uint64_t id, int result) {
    reply_value(w, id, result, 0);
}

/* Hand `fd` (consumed) to the caller as its call's answer. The descriptor is added first and
 * pid 1's copy closed before the answer lets the caller go on (not SECCOMP_ADDFD_FLAG_SEND):
 * a copy of pid 1's still open for writing when the caller runs the file it has just written
 * and closed (`cc -o prog && ./prog`) would make that exec fail with ETXTBSY. */
static void reply_fd(struct namewatch *w, uint64_t id, int fd, int flags) {
    struct seccomp_notif_addfd add = {.id = id, .flags = 0, .srcfd = (uint32_t)fd,
                                      .newfd_flags = (uint32_t)(flags & O_CLOEXEC)};
    int added;
    while ((added = ioctl(w->listener, SECCOMP_IOCTL_NOTIF_ADDFD, &add)) < 0 && errno == EINTR) {
    }
    int error = errno;
    close(fd);
    if (added >= 0)
        reply_value(w, id, 0, added);
    else if (error != ENOENT)  /* (ENOENT: the caller is gone) */
        reply(w, id, -error);
}

static int result_of(int done) {
    return done < 0 ? -errno : 0;
}

/* The caller's umask, made pid 1's for the next call (pid 1 makes no file of its own). */
static void take_umask(uint32_t tid) {
    char text[2048];
    unsigned mask = 022;
    if (proc_text(tid, "status", text, sizeof text) > 0) {
        const char *at = strstr(text, "\nUmask:");
        if (at)
            sscanf(at, "\nUmask: %o", &mask);
    }
    umask((mode_t)(mask & 0777));
}

/* Open `p` as `flags` ask in a child, which may wait (a fifo's other end), and answers. */
static void open_in_child(struct namewatch *w, uint64_t id, const struct place *p, int flags,
                          mode_t mode) {
    pid_t child = fork();
    if (child < 0) {
        reply(w, id, -errno);
        return;
    }
    if (child == 0) {
        int fd = openat(p->parent, p->name, flags, mode);
        if (fd < 0)
            reply(w, id, -errno);
        else
            reply_fd(w, id, fd, flags);
        _exit(0);
    }
}

/* Open `p` as `flags` ask and answer with it, never waiting in pid 1's only thread, which
 * the lifeline and every other caller wait on: what a blocking open may wait for goes to a
 * child (a fifo, found by fstatat with `at`, or made or swapped in meanwhile: ENXIO; a file
 * under another's lease: EWOULDBLOCK); all else is opened non-blocking, then made blocking
 * again. 0 when answered, else -1 with errno and nothing answered. */
static int open_unwaiting(struct namewatch *w, uint64_t id, const struct place *p, int flags,
                          mode_t mode, int at) {
    int blocking = !(flags & (O_NONBLOCK | O_PATH));  /* (an O_PATH open waits for nothing) */
    struct stat info;
    if (blocking && fstatat(p->parent, p->last, &info, at) == 0 && S_ISFIFO(info.st_mode)) {
        open_in_child(w, id, p, flags, mode);
        return 0;
    }
    int fd = openat(p->parent, p->name, flags | O_NONBLOCK, mode);
    if (fd < 0 && blocking && (errno == ENXIO || errno == EWOULDBLOCK)) {
        open_in_child(w, id, p, flags, mode);
        return 0;
    }
    if (fd < 0)
        return -1;
    /* (closing a fifo made meanwhile would end its reader's wait: it goes over) */
    if (blocking)
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    reply_fd(w, id, fd, flags);
    return 0;
}

/* open/openat/creat with O_CREAT of `path` from the caller's `dir`. */
static void open_for(struct namewatch *w, const struct seccomp_notif *call, int dir,
                     char *path, int flags, mode_t mode) {
    uint32_t tid = call->pid;
    struct place p;
    int base = caller_dir(tid, dir);
    if (base < 0) {
        reply(w, call->id, -errno);
        return;
    }
    take_umask(tid);
    for (int links = 0;; links++) {
        int found = find_place(tid, base, path, &p);
        if (found < 0) {
            reply(w, call->id, found);
            break;
        }
        if ((flags & (O_PATH | __O_TMPFILE)) || on_proc(p.parent) || strcmp(p.last, ".") == 0
            || strcmp(p.last, "..") == 0) {  /* (no name can be made: the kernel decides) */
            /* a procfs magic link may lead to a fifo or a device: followed, never waited on */
            if (open_unwaiting(w, call->id, &p, flags, mode,
                               flags & O_NOFOLLOW ? AT_SYMLINK_NOFOLLOW : 0) != 0)
                reply(w, call->id, -errno);
            break;
        }
        const char *name = protected_name(w, &p);
        if (name && (flags & O_EXCL)) {
            reply(w, call->id, judge(w, &p, "open"));
            break;
        }
        /* the last component itself: a symlink there is followed here, from its text */
        int asked = (name ? flags & ~O_CREAT : flags) | (flags & O_EXCL ? 0 : O_NOFOLLOW);
        if (open_unwaiting(w, call->id, &p, asked, mode, AT_SYMLINK_NOFOLLOW) == 0)
            break;
        if (errno == ELOOP && !(flags & (O_NOFOLLOW | O_EXCL))) {
            ssize_t size = readlinkat(p.parent, p.last, path, PATH_MAX - 1);
            if (links == LINKS_MAX || size <= 0) {
                reply(w, call->id, links == LINKS_MAX ? -ELOOP : size == 0 ? -ENOENT : -errno);
                break;
            }
            path[size] = 0;
            base = p.parent;  /* (a relative link is read from its own directory) */
            continue;
        }
        reply(w, call->id, name && errno == ENOENT ? judge(w, &p, "open")
                                                   : noted(w, &p, "open", -errno));
        break;
    }
    leave(&p);
}

/* A path argument, read once into `text` (PATH_MAX bytes); 0 or -errno. */
static int argument(uint32_t tid, uint64_t address, char *text) {
    return caller_string(tid, address, text, PATH_MAX) == 0 ? 0 : -errno;
}

/* mkdir, mknod, symlink: a name made in one place. */
static int make(struct namewatch *w, const struct seccomp_notif *call, int nr, int dir,
                const char *path, const char *target, uint64_t mode, uint64_t device) {
    struct place p;
    uint32_t tid = call->pid;
    int result = place_from(tid, dir, path, &p);
    const char *what = nr == __NR_mkdirat ? "mkdir" : nr == __NR_mknodat ? "mknod" : "symlink";
    if (result == 0)
        result = judge(w, &p, what);
    if (result == 0 && nr != __NR_symlinkat)
        take_umask(tid);
    if (result == 0)
        result = result_of(nr == __NR_mkdirat ? mkdirat(p.parent, p.name, (mode_t)mode)
                           : nr == __NR_mknodat ? mknodat(p.parent, p.name, (mode_t)mode,
                                                          (dev_t)device)
                           : symlinkat(target, p.parent, p.name));
    if (p.parent >= 0)
        result = noted(w, &p, what, result);
    leave(&p);
    return result;
}

/* link, rename: a name made from another. */
static int move(struct namewatch *w, const struct seccomp_notif *call, int nr, int old_dir,
                const char *old_path, int new_dir, const char *new_path, unsigned flags) {
    struct place from = {.parent = -1}, to = {.parent = -1};
    uint32_t tid = call->pid;
    int linking = nr == __NR_linkat, result = 0, source = -1;
    if (linking && (flags & ~(unsigned)(AT_SYMLINK_FOLLOW | AT_EMPTY_PATH)))
        return -EINVAL;
    if (linking && (flags & AT_EMPTY_PATH) && old_path[0] == 0) {
        source = caller_dir(tid, old_dir);  /* the descriptor's own file */
        result = source < 0 ? -errno : 0;
    } else if (linking && (flags & AT_SYMLINK_FOLLOW)) {
        int base = caller_dir(tid, old_dir);
        source = base < 0 ? -1 : caller_resolve(tid, base, old_path);
        result = source < 0 ? -errno : 0;
    } else {
        result = place_from(tid, old_dir, old_path, &from);
    }
    if (result == 0)
        result = place_from(tid, new_dir, new_path, &to);
    if (result == 0)
        result = judge(w, &to, linking ? "link" : "rename");
    if (result == 0 && !linking && (flags & RENAME_EXCHANGE))
        result = judge(w, &from, "rename");
    if (result == 0 && source >= 0) {  /* (the kernel's own way to link a descriptor's file) */
        char own[64];
        snprintf(own, sizeof own, "/proc/self/fd/%d", source);
        result = result_of(linkat(AT_FDCWD, own, to.parent, to.name, AT_SYMLINK_FOLLOW));
    } else if (result == 0) {
        result = result_of(linking ? linkat(from.parent, from.name, to.parent, to.name, 0)
                           : renameat2(from.parent, from.name, to.parent, to.name, flags));
    }
    if (to.parent >= 0)
        result = noted(w, &to, linking ? "link" : "rename", result);
    if (source >= 0)
        close(source);
    leave(&from);
    leave(&to);
    return result;
}

/* A trapped call, as its *at form: the legacy calls name paths from the working directory. */
struct request {
    int nr;                       /* __NR_openat, __NR_mkdirat, … __NR_renameat2 */
    int dir, new_dir, flags;
    uint64_t path, new_path, target, mode, device;  /* (new_path: link, rename) */
};

static int decode(const struct seccomp_data *data, struct request *r) {
    const __u64 *a = data->args;
    int cwd = AT_FDCWD;
    switch (data->nr) {
#ifdef __NR_mkdir
    case __NR_mkdir: *r = (struct request){__NR_mkdirat, cwd, 0, 0, a[0], 0, 0, a[1], 0}; break;
    case __NR_mknod: *r = (struct request){__NR_mknodat, cwd, 0, 0, a[0], 0, 0, a[1], a[2]}; break;
    case __NR_symlink: *r = (struct request){__NR_symlinkat, cwd, 0, 0, a[1], 0, a[0], 0, 0};
        break;
    case __NR_link: *r = (struct request){__NR_linkat, cwd, cwd, 0, a[0], a[1], 0, 0, 0}; break;
    case __NR_rename: *r = (struct request){__NR_renameat2, cwd, cwd, 0, a[0], a[1], 0, 0, 0};
        break;
    case __NR_open: *r = (struct request){__NR_openat, cwd, 0, (int)a[1], a[0], 0, 0, a[2], 0};
        break;
    case __NR_creat: *r = (struct request){__NR_openat, cwd, 0, O_CREAT | O_WRONLY | O_TRUNC,
                                           a[0], 0, 0, a[1], 0}; break;
#endif
    case __NR_mkdirat: *r = (struct request){__NR_mkdirat, (int)a[0], 0, 0, a[1], 0, 0, a[2], 0};
        break;
    case __NR_mknodat: *r = (struct request){__NR_mknodat, (int)a[0], 0, 0, a[1], 0, 0, a[2],
                                             a[3]}; break;
    case __NR_symlinkat: *r = (struct request){__NR_symlinkat, (int)a[1], 0, 0, a[2], 0, a[0],
                                               0, 0}; break;
    case __NR_linkat: *r = (struct request){__NR_linkat, (int)a[0], (int)a[2], (int)a[4], a[1],
                                            a[3], 0, 0, 0}; break;
#ifdef __NR_renameat
    case __NR_renameat: *r = (struct request){__NR_renameat2, (int)a[0], (int)a[2], 0, a[1],
                                              a[3], 0, 0, 0}; break;
#endif
    case __NR_renameat2: *r = (struct request){__NR_renameat2, (int)a[0], (int)a[2], (int)a[4],
                                               a[1], a[3], 0, 0, 0}; break;
    case __NR_openat: *r = (struct request){__NR_openat, (int)a[0], 0, (int)a[2], a[1], 0, 0,
                                            a[3], 0}; break;
    default:
        return -ENOSYS;
    }
    return 0;
}

static void answer(struct namewatch *w, const struct seccomp_notif *call) {
    struct request r;
    char path[PATH_MAX], other[PATH_MAX];  /* other: the new name, or a symlink's target */
    int result = decode(&call->data, &r);
    int moving = r.nr == __NR_linkat || r.nr == __NR_renameat2;
    if (result == 0)
        result = argument(call->pid, r.path, path);
    if (result == 0 && (moving || r.nr == __NR_symlinkat))
        result = argument(call->pid, moving ? r.new_path : r.target, other);
    /* what was read is the caller's, still waiting: else its tid may name another task */
    if (ioctl(w->listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &call->id) != 0)
        return;
    if (result == 0 && r.nr == __NR_openat) {
        open_for(w, call, r.dir, path, r.flags, (mode_t)r.mode);
        return;
    }
    if (result == 0)
        result = moving ? move(w, call, r.nr, r.dir, path, r.new_dir, other, (unsigned)r.flags)
            : make(w, call, r.nr, r.dir, path, other, r.mode, r.device);
    reply(w, call->id, result);
}

void namewatch_answer(struct namewatch *w, const struct seccomp_notif *call) {
    answer(w, call);
}

unsigned namewatch_unrecorded(const struct namewatch *w) {
    return w->unrecorded;
}

struct namewatch *namewatch_open(int listener, const char *names, uint32_t names_size,
                                 const char *free, uint32_t free_size) {
    struct seccomp_notif_sizes sizes;
    struct namewatch *w = calloc(1, sizeof *w);
    if (!w || syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes) != 0)
        return NULL;
    w->listener = listener;
    w->names = names, w->names_size = names_size;
    w->response_size = sizes.seccomp_notif_resp > sizeof *w->response
        ? sizes.seccomp_notif_resp : sizeof *w->response;
    w->response = calloc(1, w->response_size);
    if (!w->response)
        return NULL;
    for (const char *n = names; n < names + names_size; n += strlen(n) + 1) {
        const char *slash = strrchr(n, '/');
        char directory[PATH_MAX];
        struct stat info;
        if (!slash || (size_t)(slash - n) >= sizeof directory)
            continue;
        memcpy(directory, n, slash - n);
        directory[slash - n] = 0;
        if (stat(directory[0] ? directory : "/", &info) != 0)
            return NULL;  /* (made before the launch and pinned: missing, the launch fails) */
        struct placed *more = realloc(w->placed, (w->placed_count + 1) * sizeof *more);
        if (!more)
            return NULL;
        w->placed = more;
        w->placed[w->placed_count++] = (struct placed){info.st_dev, info.st_ino, slash + 1, n};
    }
    for (const char *path = free; path < free + free_size; path += strlen(path) + 1) {
        struct statx info;
        if (w->free_count < FREE_MAX
            && statx(AT_FDCWD, path, AT_STATX_DONT_SYNC, STATX_MNT_ID, &info) == 0
            && (info.stx_mask & STATX_MNT_ID))
            w->free[w->free_count++] = info.stx_mnt_id;
    }
    return w;
}
