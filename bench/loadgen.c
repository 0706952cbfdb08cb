/* A load generator for bench/saturation.py that does not compete for the cores.
 *
 * wrk copies every byte it receives into its own memory; at a clone mix's 3 GB/s that
 * is most of a core, the core a second server worker needs on a 2-core machine. This
 * one sends the same jobs as saturation.py's Lua script (GET info/refs, POST ls-refs,
 * POST fetch, round robin over the copies, keep-alive) from one blocking thread per
 * connection, reads each answer's status line and headers, and discards its body in
 * the kernel: recv(2) with MSG_TRUNC, which on a TCP socket drops the bytes without
 * copying them (tcp(7)). Chunked bodies are parsed for their chunk sizes; the chunk
 * data is dropped the same way.
 *
 *   loadgen HOST PORT CONNS SECONDS COPIES LS_BODY FETCH_BODY
 *
 * Prints "requests N", "non2xx N", "errors N", "bytes N" (body bytes dropped) and
 * "seconds S" (from the start until the last answer ended).
 * Built by saturation.py with the machine's cc; not part of the server.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define BUF 65536
#define DROP (4 << 20)

static const char *host;
static int port, conns, copies;
static double seconds;
static char *bodies[2];
static size_t body_len[2];
static atomic_long requests, non2xx, errors, dropped;
static struct timespec deadline;

struct conn {
    long index;
    int fd;
    char buf[BUF];
    size_t have, at; /* bytes in buf, and where unread ones start */
    char *scratch;   /* MSG_TRUNC needs no buffer on TCP; one is passed all the same */
};

static int expired(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > deadline.tv_sec ||
           (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec);
}

static int dial(struct conn *c) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0) return -1;
    struct timeval tv = {.tv_sec = 60};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    c->have = c->at = 0;
    return 0;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* More bytes into the buffer (compacted first); 0 at end of stream, -1 on error. */
static ssize_t fill(struct conn *c) {
    if (c->at) {
        memmove(c->buf, c->buf + c->at, c->have - c->at);
        c->have -= c->at;
        c->at = 0;
    }
    if (c->have == BUF) return -1; /* a header line longer than the buffer */
    ssize_t k = recv(c->fd, c->buf + c->have, BUF - c->have, 0);
    if (k > 0) c->have += (size_t)k;
    return k;
}

/* One line (without CRLF) at c->buf + *start, its length in *len; -1 on error. */
static int line(struct conn *c, size_t *start, size_t *len) {
    for (;;) {
        char *p = memmem(c->buf + c->at, c->have - c->at, "\r\n", 2);
        if (p) {
            *start = c->at;
            *len = (size_t)(p - (c->buf + c->at));
            c->at += *len + 2;
            return 0;
        }
        if (fill(c) <= 0) return -1;
    }
}

/* Drop n body bytes: those buffered first, then in the kernel. */
static int drop(struct conn *c, size_t n) {
    size_t buffered = c->have - c->at;
    size_t take = n < buffered ? n : buffered;
    c->at += take;
    n -= take;
    atomic_fetch_add(&dropped, (long)take);
    while (n) {
        ssize_t k = recv(c->fd, c->scratch, n < DROP ? n : DROP, MSG_TRUNC);
        if (k <= 0) return -1;
        n -= (size_t)k;
        atomic_fetch_add(&dropped, (long)k);
    }
    return 0;
}

/* One answer: status, headers, body. Returns the status, or -1; *close when the server
 * said it closes the connection. */
static int answer(struct conn *c, int *close_after) {
    size_t s, n;
    if (line(c, &s, &n) < 0 || n < 12 || strncmp(c->buf + s, "HTTP/1.", 7)) return -1;
    int status = atoi(c->buf + s + 9);
    long length = -1;
    int chunked = 0;
    *close_after = 0;
    for (;;) {
        if (line(c, &s, &n) < 0) return -1;
        if (n == 0) break;
        char *h = c->buf + s;
        if (n > 15 && !strncasecmp(h, "Content-Length:", 15))
            length = atol(h + 15);
        else if (n > 18 && !strncasecmp(h, "Transfer-Encoding:", 18) &&
                 memmem(h, n, "chunked", 7))
            chunked = 1;
        else if (n > 11 && !strncasecmp(h, "Connection:", 11) && memmem(h, n, "close", 5))
            *close_after = 1;
    }
    if (chunked) {
        for (;;) {
            if (line(c, &s, &n) < 0) return -1;
            c->buf[s + n] = 0; /* the CR: in the buffer, already consumed */
            char *end;
            long size = strtol(c->buf + s, &end, 16);
            if (size < 0 || end == c->buf + s || (*end && *end != ';')) return -1;
            if (size == 0) {
                do { /* trailers, up to the empty line */
                    if (line(c, &s, &n) < 0) return -1;
                } while (n);
                break;
            }
            if (drop(c, (size_t)size) < 0 || line(c, &s, &n) < 0 || n) return -1;
        }
    } else if (length > 0) {
        if (drop(c, (size_t)length) < 0) return -1;
    } else if (length < 0) {
        *close_after = 1; /* to the end of the stream */
        drop(c, c->have - c->at);
        ssize_t k;
        while ((k = recv(c->fd, c->scratch, DROP, MSG_TRUNC)) > 0)
            atomic_fetch_add(&dropped, (long)k);
    }
    return status;
}

static void *run(void *arg) {
    struct conn *c = arg;
    char head[1024];
    /* Connection i starts at job i: the connections spread over the copies, as the wrk
     * script's one counter spreads its requests, instead of moving in step. */
    long n = 3 * c->index;
    c->fd = -1;
    while (!expired()) {
        if (c->fd < 0 && dial(c) < 0) {
            atomic_fetch_add(&errors, 1);
            usleep(10000); /* a refused connect: not a busy loop */
            continue;
        }
        int step = (int)(n % 3);
        long repo = (n / 3) % copies;
        int hl;
        if (step == 0)
            hl = snprintf(head, sizeof head,
                          "GET /d%ld.git/info/refs?service=git-upload-pack HTTP/1.1\r\n"
                          "Host: %s:%d\r\nGit-Protocol: version=2\r\n\r\n",
                          repo, host, port);
        else
            hl = snprintf(head, sizeof head,
                          "POST /d%ld.git/git-upload-pack HTTP/1.1\r\nHost: %s:%d\r\n"
                          "Content-Type: application/x-git-upload-pack-request\r\n"
                          "Git-Protocol: version=2\r\n"
                          "Accept: application/x-git-upload-pack-result\r\n"
                          "Content-Length: %zu\r\n\r\n",
                          repo, host, port, body_len[step - 1]);
        if (hl < 0 || (size_t)hl >= sizeof head) exit(2);
        int close_after = 1;
        int status = -1;
        if (send_all(c->fd, head, (size_t)hl) == 0 &&
            (step == 0 || send_all(c->fd, bodies[step - 1], body_len[step - 1]) == 0))
            status = answer(c, &close_after);
        if (status < 0) {
            if (!expired()) atomic_fetch_add(&errors, 1);
        } else {
            atomic_fetch_add(&requests, 1);
            if (status < 200 || status > 399) atomic_fetch_add(&non2xx, 1);
            n++;
        }
        if (status < 0 || close_after) {
            close(c->fd);
            c->fd = -1;
        }
    }
    if (c->fd >= 0) close(c->fd);
    return NULL;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = size >= 0 ? malloc((size_t)size + 1) : NULL;
    if (!p || fread(p, 1, (size_t)size, f) != (size_t)size) exit(2);
    fclose(f);
    *len = (size_t)size;
    return p;
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: loadgen HOST PORT CONNS SECONDS COPIES LS_BODY FETCH_BODY\n");
        return 2;
    }
    host = argv[1];
    port = atoi(argv[2]);
    conns = atoi(argv[3]);
    seconds = atof(argv[4]);
    copies = atoi(argv[5]);
    bodies[0] = slurp(argv[6], &body_len[0]);
    bodies[1] = slurp(argv[7], &body_len[1]);
    struct in_addr probe;
    if (conns < 1 || copies < 1 || seconds <= 0 || inet_pton(AF_INET, host, &probe) != 1)
        return 2;
    struct timespec start, stop;
    clock_gettime(CLOCK_MONOTONIC, &start);
    deadline = start;
    deadline.tv_sec += (time_t)seconds;
    deadline.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_t *t = calloc((size_t)conns, sizeof *t);
    struct conn *cs = calloc((size_t)conns, sizeof *cs);
    if (!t || !cs) return 2;
    for (int i = 0; i < conns; i++) {
        cs[i].index = i;
        cs[i].scratch = malloc(DROP);
        if (!cs[i].scratch || pthread_create(&t[i], NULL, run, &cs[i])) return 2;
    }
    for (int i = 0; i < conns; i++) pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &stop);
    /* requests that ended after the deadline are counted: so is the time they took */
    double took = (double)(stop.tv_sec - start.tv_sec) + (stop.tv_nsec - start.tv_nsec) / 1e9;
    printf("requests %ld\nnon2xx %ld\nerrors %ld\nbytes %ld\nseconds %.3f\n",
           atomic_load(&requests), atomic_load(&non2xx), atomic_load(&errors),
           atomic_load(&dropped), took);
    return 0;
}
