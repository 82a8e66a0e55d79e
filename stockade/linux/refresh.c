/* A spare's own filesystems (what mnt.build makes for a sandbox built at launch): over the
 * template's proc, /tmp, /dev/shm and /dev/pts, which it shares with every other spare, fresh
 * instances of its own. What lay on the template's /tmp (roots below it, the directories
 * leading to them, alias links; template.py lists them) is made again on the fresh /tmp, a
 * mount as a recursive clone taken before the cover. Paths below /tmp are resolved beneath
 * it, following no link, as mnt.py resolves them. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "supervisor.h"

static const uint64_t BENEATH = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

static int open_beneath(int dir, const char *path, uint64_t flags) {
    struct open_how how = {.flags = flags | O_CLOEXEC, .resolve = BENEATH};
    return (int)syscall(SYS_openat2, dir, path, &how, sizeof how);
}

/* A fresh, detached instance of `f`; -1 on failure. */
static int new_fs(const struct filesystem *f) {
    int config = (int)syscall(SYS_fsopen, f->type, FSOPEN_CLOEXEC), mount = -1;
    if (config < 0)
        return -1;
    for (uint32_t k = 0; k < f->options; k++)
        if (syscall(SYS_fsconfig, config, FSCONFIG_SET_STRING, f->option[2 * k],
                    f->option[2 * k + 1], 0) != 0)
            goto done;
    if (syscall(SYS_fsconfig, config, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0)
        mount = (int)syscall(SYS_fsmount, config, FSMOUNT_CLOEXEC, f->attrs);
done:
    close(config);
    return mount;
}

static int attach(int tree, int target) {
    return (int)syscall(SYS_move_mount, tree, "", target, "",
                        MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH);
}

static int cover(const struct filesystem *f) {
    int target = open(f->path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int fs = target < 0 ? -1 : new_fs(f);
    int done = fs < 0 ? -1 : attach(fs, target);
    if (fs >= 0)
        close(fs);
    if (target >= 0)
        close(target);
    return done;
}

/* Make `item` on the fresh /tmp (`tree`: its mount's clone, for CARRIED_MOUNT). */
static int place(int tmp, const struct carried *item, int tree) {
    const char *slash = strrchr(item->path, '/'), *name = slash ? slash + 1 : item->path;
    char *parent = slash ? strndup(item->path, (size_t)(slash - item->path)) : strdup(".");
    int where = parent ? open_beneath(tmp, parent, O_PATH | O_DIRECTORY) : -1;
    free(parent);
    if (where < 0)
        return -1;
    struct stat info;
    int done;
    if (item->kind == CARRIED_LINK)
        done = symlinkat(item->link, where, name);
    else if (item->kind == CARRIED_DIRECTORY || (fstat(tree, &info) == 0 && S_ISDIR(info.st_mode)))
        done = mkdirat(where, name, 0755);
    else {
        int file = openat(where, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
        done = file < 0 ? -1 : close(file);
    }
    if (done == 0 && item->kind == CARRIED_MOUNT) {
        int target = open_beneath(where, name, O_PATH);
        done = target < 0 ? -1 : attach(tree, target);
        if (target >= 0)
            close(target);
    }
    close(where);
    return done;
}

int refresh(const struct spec *s) {
    int old_tmp = open("/tmp", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int *trees = calloc(s->carried ? s->carried : 1, sizeof *trees);
    if (old_tmp < 0 || !trees)
        return -1;
    for (uint32_t i = 0; i < s->carried; i++) {
        trees[i] = -1;
        if (s->carry[i].kind != CARRIED_MOUNT)
            continue;
        int at = open_beneath(old_tmp, s->carry[i].path, O_PATH | O_NOFOLLOW);
        trees[i] = at < 0 ? -1 : (int)syscall(SYS_open_tree, at, "", OPEN_TREE_CLONE
                                              | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE);
        if (at >= 0)
            close(at);
        if (trees[i] < 0)
            return -1;
    }
    close(old_tmp);
    for (uint32_t i = 0; i < s->filesystems; i++)
        if (cover(&s->filesystem[i]) != 0)
            return -1;
    int tmp = open("/tmp", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (tmp < 0)
        return -1;
    for (uint32_t i = 0; i < s->carried; i++) {
        if (place(tmp, &s->carry[i], trees[i]) != 0)
            return -1;
        if (trees[i] >= 0)
            close(trees[i]);
    }
    close(tmp);
    free(trees);
    return 0;
}
