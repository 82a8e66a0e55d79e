/* Shared by the parts of the supervisor program (supervisor.c, template.c, refresh.c,
 * confine.c): exit statuses, reading the little-endian records Python writes, and the spec a
 * view template serves its spares from (template.py writes it; template.c reads it). */
#ifndef STOCKADE_SUPERVISOR_H
#define STOCKADE_SUPERVISOR_H

#include <stddef.h>
#include <sys/types.h>
#include <stdint.h>
#include <string.h>

enum { SETUP_FAILED = 70, START_FAILED = 71 };

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64   /* (linux/audit.h) the calling convention the watches read */
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#endif

/* ---- reading records: every read checks the bounds and sets *bad instead of failing ---- */

struct reader {
    const char *at, *end;
};

static inline int take(struct reader *r, void *out, size_t size) {
    if ((size_t)(r->end - r->at) < size)
        return -1;
    memcpy(out, r->at, size);
    r->at += size;
    return 0;
}

static inline uint32_t u32(struct reader *r, int *bad) {
    uint32_t v = 0;
    *bad |= take(r, &v, sizeof v);  /* (little-endian hosts: x86_64, aarch64) */
    return v;
}

static inline int64_t i64(struct reader *r, int *bad) {
    int64_t v = 0;
    *bad |= take(r, &v, sizeof v);
    return v;
}

/* Bytes: their length, then them; *size is set to the length. */
static inline const char *blob(struct reader *r, uint32_t *size, int *bad) {
    *size = u32(r, bad);
    if (*bad || (size_t)(r->end - r->at) < *size) {
        *bad = 1, *size = 0;
        return "";
    }
    const char *b = r->at;
    r->at += *size;
    return b;
}

/* A string: its length, its bytes (no NUL among them), then a NUL. */
static inline const char *string(struct reader *r, int *bad) {
    uint32_t size = u32(r, bad);
    if (*bad || (size_t)(r->end - r->at) <= size || r->at[size] != 0
        || memchr(r->at, 0, size)) {
        *bad = 1;
        return "";
    }
    const char *s = r->at;
    r->at += size + 1;
    return s;
}

/* ---- a view template's spec (template.py's _spec writes it in this order) ---- */

enum { LAYER_LANDLOCK = 1, LAYER_PRIVILEGES = 2, LAYER_SECCOMP = 4, PROXY_LISTENER = 8,
       MEMFD_NOEXEC = 16 };
enum { CARRIED_DIRECTORY = 0, CARRIED_LINK = 1, CARRIED_MOUNT = 2 };

struct filesystem {       /* a fresh instance each spare mounts over the template's */
    const char *path, *type;
    uint64_t attrs;       /* MOUNT_ATTR_* */
    uint32_t options;     /* pairs in option[]: key, value */
    const char **option;
};

struct carried {          /* what lay on the template's /tmp, to be made on a spare's own */
    uint32_t kind;
    const char *path;     /* relative to /tmp, parents before children */
    const char *link;     /* CARRIED_LINK: its target */
};

struct rule {             /* a Landlock path rule */
    const char *path;
    uint64_t access;
};

struct spec {
    uint32_t flags, uid, gid, port;
    int64_t pid_max;                    /* -1: none */
    const char *identity;               /* the survey's identity, said with "M" */
    uint32_t identity_size;
    void *bpf;                          /* the seccomp program (struct sock_filter[]) */
    uint32_t bpf_size;
    uint32_t filesystems, carried, rules, ports;
    struct filesystem *filesystem;
    struct carried *carry;
    uint64_t handled_fs, handled_net, scoped;
    struct rule *rule;
    uint64_t *port_rule;                /* TCP ports the command may connect to */
};

/* ---- bounds on the events written while the command runs (supervisor.c) ---- */

/* Records of one kind written while the command runs (a protected name, a git write, a memory
 * refusal), bounded for a warm sandbox's life as for one command's: at most EVENTS_RECORDED in
 * a window of EVENT_WINDOW seconds, the window beginning at its first. */
enum { EVENTS_RECORDED = 100, EVENT_WINDOW = 10 };
struct budget {
    time_t since;
    unsigned used;
};
/* How many records of `b`'s kind came before this one in its window (EVENTS_RECORDED + 1 at
 * most: the first past the bound says "more", the rest are not written). */
unsigned budget_next(struct budget *b);

/* ---- the command's address-space requests, seen at limits.memory (memwatch.c) ---- */

/* ... and, where exec_from_write = false, its executable mappings and executions of written
 * files: the second layer beside noexec mounts; its memfds made sealed non-executable
 * (memwatch.c) */

enum { WRITTEN_MAX = 64 };              /* mounts the command may write */

struct memwatch {
    int listener;                       /* the filter's notifications; -1: not watching */
    int memory, exec, seal;             /* what it watches */
    uint64_t page, limit_pages;
    uint64_t refused;                   /* requests answered ENOMEM */
    uint64_t largest, in_use;           /* bytes: the largest refused, and in use then */
    uint64_t exec_refused;              /* mappings and executions answered EACCES */
    struct budget said;                 /* memory_refused events written */
    uint64_t written[WRITTEN_MAX];      /* the mount ids of the written mounts */
    int written_count;
    struct seccomp_notif *request;
    struct seccomp_notif_resp *response;
    size_t request_size;
    struct namewatch *names;            /* the creating calls' (namewatch.c); NULL: none */
};

/* in the command, before exec: the listener, or -1 (one filter, one listener: the kernel
 * allows a process no second); `names`: its creating calls too (namewatch.c) */
int memwatch_install(int memory, int exec, int seal, int names);
/* 0: watching. `written` holds `written_size` bytes of NUL-ended paths, for the exec watch */
int memwatch_open(struct memwatch *watch, int listener, int64_t limit, int exec, int seal,
                  const char *written, uint32_t written_size);
void memwatch_answer(struct memwatch *watch);  /* one pending request */
int memwatch_summary(const struct memwatch *watch, char *out, size_t room);  /* JSON part */

/* ---- the command's tasks, as pid 1 sees them (memwatch.c) ---- */

/* Up to `room` - 1 bytes of /proc/<tid>/<what>, NUL-ended; the count read (<= 0: none). */
ssize_t proc_text(uint32_t tid, const char *what, char *text, size_t room);
/* The NUL-ended string at `address` of task `tid`'s memory, in `text` (`room` bytes); 0, or
 * -1 with errno: EACCES when the task's memory cannot be read at all, EFAULT when the string
 * is not there, ENAMETOOLONG when it does not end within `room`. */
int caller_string(uint32_t tid, uint64_t address, char *text, size_t room);
/* An O_PATH descriptor on task `tid`'s working directory (`dir` AT_FDCWD) or on its
 * descriptor `dir`; -1 with errno. */
int caller_dir(uint32_t tid, int dir);
/* Follow `path` from `dir` (consumed) as task `tid` would: component by component, no symlink
 * followed by the kernel but procfs's own (magic) links; "self" and "thread-self" in /proc,
 * and symlinks naming them, read as /proc/<tid>. An O_PATH descriptor, or -1 with errno. */
int caller_resolve(uint32_t tid, int dir, const char *path);
/* Whether looking `name` up in directory `dir` for task `tid` would reach into the /proc/<pid>
 * of another thread group than the caller's: `dir` lies in one (at any depth, however it was
 * reached: /proc/1 as the working directory, a descriptor, a magic link), or `dir` is
 * procfs's root and `name` is one. */
int another_process(uint32_t tid, int dir, const char *name);
extern int proc_unguarded;  /* (tests only: the evidence's "proc_guard" off) never another's */

/* ---- protected names the command may not make (namewatch.c) ---- */

struct namewatch;
extern const int NAMEWATCH_CALLS[];     /* the calls that make a name; open/openat with O_CREAT */
extern const int NAMEWATCH_CALL_COUNT;
/* In pid 1, on the watch's `listener`: `names` (`names_size` bytes of NUL-ended names, lower
 * case) may not be made but on the mounts of the `free` paths (`free_size` bytes), an entry
 * "directory/name" not in that directory; NULL on failure. */
struct namewatch *namewatch_open(int listener, const char *names, uint32_t names_size,
                                 const char *free, uint32_t free_size);
int namewatch_traps(int nr);            /* whether call `nr` is one of them (or open/openat) */
void namewatch_answer(struct namewatch *w, const struct seccomp_notif *call);
unsigned namewatch_unrecorded(const struct namewatch *w);  /* refusals whose event was lost */

/* ---- events on STATUS (supervisor.c) ---- */

struct text {
    char *data;
    size_t size, room;
};

void put(struct text *t, const char *bytes, size_t size);
void put_string(struct text *t, const char *s);  /* a JSON string, as Python decodes it */
void emit_event(struct text *event);              /* one line on STATUS; frees the text */
/* The same while the command runs: at most PIPE_BUF bytes, and only if the pipe has room
 * now (0), else lost (-1) */
int emit_event_unwaiting(struct text *event);

int template_main(int spec_fd, int plan_fd, int handoff, int host_proc);  /* template.c */
int refresh(const struct spec *spec);                                      /* refresh.c */
int confine(const struct spec *spec);                                      /* confine.c */
_Noreturn void supervise(int plan_fd, int listener, int handoff, const int *launch_fds);
int send_fds(int sock, char byte, const int *fds, int count);             /* supervisor.c */

#endif
