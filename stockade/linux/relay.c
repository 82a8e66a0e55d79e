/* The egress proxy's tunnel relay in C (stockade/net/relay.py loads it through ctypes).
 *
 *     int stockade_relay(int client, int upstream, int idle_ms)
 *
 * Copies bytes both ways between two connected stream sockets until both directions have
 * ended, in the calling thread. ctypes releases the interpreter's lock for the call, so a
 * tunnel's bytes never wait for Python: an owner busy in Python code would otherwise hold each
 * chunk back for up to the interpreter's switch interval (5 ms). The rules are those of the
 * Python relay it stands in for:
 *
 * - the idle timeout covers the tunnel as a whole: it ends when no byte has moved either way
 *   for idle_ms (a long download is not idle because the client says nothing);
 * - a direction whose peer stops reading ends the tunnel once it has sent nothing for idle_ms,
 *   however busy the other direction is;
 * - EOF one way is passed on as a half-close (shutdown SHUT_WR) once that way's bytes are
 *   out, and the other way goes on;
 * - an error either way, or the idle timeout, shuts both sockets down (SHUT_RDWR); so does the
 *   proxy stopping, from outside, which this loop then sees as EOF or an error.
 *
 * Returns 0 when both ways ended with EOF, -1 when the tunnel was cut. The caller closes the
 * sockets. The descriptors' flags are left alone (MSG_DONTWAIT per call): the caller's socket
 * objects stay as they were.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

/* A direction's buffer starts small and grows once a read fills it: bulk transfers get fewer,
 * larger system calls; the many quiet tunnels keep little memory. */
enum { FIRST_CHUNK = 64 * 1024, BULK_CHUNK = 1024 * 1024, ROUNDS_PER_WAKE = 16 };

struct way {
    int from, to;
    char *buf;
    size_t cap, len, off; /* bytes buf[off..len) are read and not yet sent */
    int filled;           /* the last read filled buf: the next one gets a larger buffer */
    int eof;              /* `from` said EOF, and it was passed on once the bytes were out */
    int64_t progress;     /* when a byte of this way was last sent, or read into an empty buf */
};

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int would_block(void)
{
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

/* Move what can move now along `w`. Returns -1 on an error (the tunnel is to be cut), else
 * 0. */
static int pump(struct way *w, int64_t *last_traffic)
{
    for (int round = 0; round < ROUNDS_PER_WAKE; round++) {
        if (w->off < w->len) {
            ssize_t sent = send(w->to, w->buf + w->off, w->len - w->off,
                                MSG_DONTWAIT | MSG_NOSIGNAL);
            if (sent < 0)
                return would_block() ? 0 : -1;
            w->off += (size_t)sent;
            w->progress = *last_traffic = now_ms();
            if (w->off == w->len)
                w->off = w->len = 0;
            continue;
        }
        if (w->eof)
            return 0;
        if (w->buf == NULL || (w->filled && w->cap < BULK_CHUNK)) {
            size_t cap = w->buf == NULL ? FIRST_CHUNK : BULK_CHUNK;
            char *grown = realloc(w->buf, cap); /* (empty: nothing to keep) */
            if (grown == NULL)
                return -1;
            w->buf = grown;
            w->cap = cap;
        }
        ssize_t got = recv(w->from, w->buf, w->cap, MSG_DONTWAIT);
        if (got < 0)
            return would_block() ? 0 : -1;
        if (got == 0) {
            w->eof = 1;
            return shutdown(w->to, SHUT_WR) < 0 && errno != ENOTCONN ? -1 : 0;
        }
        w->len = (size_t)got;
        w->off = 0;
        w->filled = (size_t)got == w->cap;
        w->progress = *last_traffic = now_ms();
    }
    return 0;
}

int stockade_relay(int client, int upstream, int idle_ms)
{
    struct way ways[2] = {{.from = client, .to = upstream}, {.from = upstream, .to = client}};
    int64_t last_traffic = now_ms();
    int result = -1;
    for (;;) {
        if (ways[0].eof && ways[1].eof) {
            result = 0;
            break;
        }
        int64_t deadline = last_traffic + idle_ms;
        struct pollfd fds[2] = {{.fd = client}, {.fd = upstream}};
        for (int i = 0; i < 2; i++) {
            struct way *w = &ways[i];
            if (w->off < w->len) {
                fds[1 - i].events |= POLLOUT; /* its bytes wait for `to` */
                if (w->progress + idle_ms < deadline)
                    deadline = w->progress + idle_ms;
            } else if (!w->eof) {
                fds[i].events |= POLLIN;
            }
        }
        /* poll reports POLLHUP and POLLERR even unasked: a socket this tunnel has nothing to
         * do with now (say, an upstream that has closed while its last bytes wait for the
         * client to read) is left out, or the wait would return at once, for ever. */
        for (int i = 0; i < 2; i++)
            if (fds[i].events == 0)
                fds[i].fd = -1;
        int64_t wait = deadline - now_ms();
        if (wait <= 0)
            break; /* idle, or a peer that stopped reading */
        if (poll(fds, 2, wait > INT32_MAX ? INT32_MAX : (int)wait) < 0 && errno != EINTR)
            break;
        if (pump(&ways[0], &last_traffic) < 0 || pump(&ways[1], &last_traffic) < 0)
            break;
    }
    if (result < 0) {
        shutdown(client, SHUT_RDWR);
        shutdown(upstream, SHUT_RDWR);
    }
    free(ways[0].buf);
    free(ways[1].buf);
    return result;
}
