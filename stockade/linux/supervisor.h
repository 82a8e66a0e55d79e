/* Shared by the parts of the supervisor program (supervisor.c, template.c, refresh.c,
 * confine.c): exit statuses, reading the little-endian records Python writes, and the spec a
 * view template serves its spares from (template.py writes it; template.c reads it). */
#ifndef STOCKADE_SUPERVISOR_H
#define STOCKADE_SUPERVISOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { SETUP_FAILED = 70, START_FAILED = 71 };

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
    uint64_t written[WRITTEN_MAX];      /* the mount ids of the written mounts */
    int written_count;
    struct seccomp_notif *request;
    struct seccomp_notif_resp *response;
    size_t request_size;
};

/* in the command, before exec: the listener, or -1 */
int memwatch_install(int memory, int exec, int seal);
/* 0: watching. `written` holds `written_size` bytes of NUL-ended paths, for the exec watch */
int memwatch_open(struct memwatch *watch, int listener, int64_t limit, int exec, int seal,
                  const char *written, uint32_t written_size);
void memwatch_answer(struct memwatch *watch);  /* one pending request */
int memwatch_summary(const struct memwatch *watch, char *out, size_t room);  /* JSON part */

int template_main(int spec_fd, int plan_fd, int handoff, int host_proc);  /* template.c */
int refresh(const struct spec *spec);                                      /* refresh.c */
int confine(const struct spec *spec);                                      /* confine.c */
_Noreturn void supervise(int plan_fd, int listener, int handoff, const int *launch_fds);
int send_fds(int sock, char byte, const int *fds, int count);             /* supervisor.c */

#endif
