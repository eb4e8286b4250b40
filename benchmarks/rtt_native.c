/* Native floor for benchmarks/arbiter_rtt.py (built on the fly with gcc, never committed
 * as a binary). Loopback only; one file, two roles:
 *
 *   rtt_native server --proto arbiter|echo [--secret S] [--lease-ms N]
 *       one thread, one level-triggered epoll loop, non-blocking TCP_NODELAY sockets on
 *       127.0.0.1:<ephemeral>; prints "listening on 127.0.0.1:PORT" and serves until
 *       SIGTERM/SIGINT, then prints one JSON line of counters and its CPU seconds.
 *       proto echo:    every length-prefixed frame is sent back as it came (no crypto).
 *       proto arbiter: the arbiter's protocol 2 (HPA2) as docs/arbiter.md describes it:
 *                      handshake (client proves first), every later frame
 *                      payload + HMAC-SHA256(session key, dir + seq + payload) via
 *                      OpenSSL's libcrypto; REGISTER -> REGISTERED, REQUEST -> GRANT at
 *                      once (no policy: what a native loop costs before any policy),
 *                      PING -> PONG, STATS -> one STATS_REPLY; COMPLETE/CANCEL/RENEW
 *                      are verified and counted. A bad frame closes that connection.
 *
 *   rtt_native features  ->  "hmac openssl" (or "hmac none": built with -DNO_OPENSSL)
 *
 *   rtt_native client --port P --proto arbiter|echo [--jobs N] [--samples S] [--warmup W]
 *                     [--interval-us U] [--io-thread] [--secret S] [--link L]
 *       forks N job processes; each connects (arbiter: handshake + REGISTER), waits for
 *       all, then loops: t0; send REQUEST (echo: a 48-byte frame); wait for the GRANT
 *       (echo: the frame back); t1; send COMPLETE (arbiter); sleep U us. Without
 *       --io-thread the job blocks in recv() itself (the native floor); with it, a second
 *       thread reads the socket and hands the grant to the caller through a mutex +
 *       condition variable, the structure of ArbiterClient (I/O thread + callback), and
 *       t1 is taken in that thread when it delivers. Prints one JSON line:
 *       {"rtt_ns": [...], "cpu_s": [...per job], "errors": [...]}.
 *
 * Build: gcc -O2 -o rtt_native rtt_native.c -lcrypto -lpthread
 *        (-DNO_OPENSSL: echo only; proto arbiter then exits 3).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef NO_OPENSSL
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif

#define MAGIC "HPA2"
#define NONCE_LEN 32
#define MAC_LEN 32
#define MAX_FRAME 65536
#define MAX_FD 4096

enum { T_REGISTER = 0x01, T_REQUEST = 0x02, T_COMPLETE = 0x03, T_PING = 0x04, T_STATS = 0x05,
       T_CANCEL = 0x06, T_RENEW = 0x07, T_REGISTERED = 0x81, T_GRANT = 0x82, T_PONG = 0x84,
       T_STATS_REPLY = 0x85 };

static int proto_arbiter = 1;
static uint8_t secret[1024];
static size_t secret_len;

static void die(const char *what) {
    perror(what);
    exit(2);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static __attribute__((unused)) void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) { p[i] = v & 0xff; v >>= 8; }
}

static __attribute__((unused)) uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    return v;
}

/* ------------------------------------------------------------------ HMAC (OpenSSL) */
#ifndef NO_OPENSSL
/* HMAC-SHA256(key, a || b) */
static void hmac2(const uint8_t *key, size_t klen, const uint8_t *a, size_t alen,
                  const uint8_t *b, size_t blen, uint8_t out[MAC_LEN]) {
    static __thread uint8_t msg[16 + MAX_FRAME];   /* the I/O thread and the caller both MAC */
    unsigned int olen = MAC_LEN;
    memcpy(msg, a, alen);
    memcpy(msg + alen, b, blen);
    if (!HMAC(EVP_sha256(), key, (int)klen, msg, alen + blen, out, &olen)) {
        fprintf(stderr, "HMAC failed\n");
        exit(2);
    }
}

static int mac_equal(const uint8_t *a, const uint8_t *b) {
    return CRYPTO_memcmp(a, b, MAC_LEN) == 0;
}

/* the three handshake values: label + MAGIC + cn + sn, keyed with the secret */
static void hs_value(const char *label, const uint8_t *cn, const uint8_t *sn, uint8_t out[MAC_LEN]) {
    uint8_t ctx[3 + 4 + 2 * NONCE_LEN];
    memcpy(ctx, label, 3);
    memcpy(ctx + 3, MAGIC, 4);
    memcpy(ctx + 7, cn, NONCE_LEN);
    memcpy(ctx + 7 + NONCE_LEN, sn, NONCE_LEN);
    hmac2(secret, secret_len, ctx, sizeof ctx, NULL, 0, out);
}

/* frame header + payload + HMAC(key, dir + seq + payload) into out; returns bytes */
static size_t seal(const uint8_t *key, char dir, uint64_t *seq, const uint8_t *payload, size_t n,
                   uint8_t *out) {
    uint8_t pre[9];
    pre[0] = (uint8_t)dir;
    put_u64(pre + 1, (*seq)++);
    put_u32(out, (uint32_t)(n + MAC_LEN));
    memcpy(out + 4, payload, n);
    hmac2(key, MAC_LEN, pre, 9, payload, n, out + 4 + n);
    return 4 + n + MAC_LEN;
}

/* verify body (payload + MAC); returns the payload length or -1 */
static long unseal(const uint8_t *key, char dir, uint64_t *seq, const uint8_t *body, size_t len) {
    uint8_t pre[9], mac[MAC_LEN];
    if (len <= MAC_LEN) return -1;
    pre[0] = (uint8_t)dir;
    put_u64(pre + 1, *seq);
    hmac2(key, MAC_LEN, pre, 9, body, len - MAC_LEN, mac);
    if (!mac_equal(mac, body + len - MAC_LEN)) return -1;
    (*seq)++;
    return (long)(len - MAC_LEN);
}
#endif

static void load_secret(const char *s) {
    /* strip surrounding whitespace, as horovod_prio.arbiter.protocol.load_secret does */
    const char *e = s + strlen(s);
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == '\v' || *s == '\f') s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r' ||
                     e[-1] == '\v' || e[-1] == '\f')) e--;
    secret_len = (size_t)(e - s);
    if (secret_len == 0 || secret_len > sizeof secret) {
        fprintf(stderr, "bad secret\n");
        exit(2);
    }
    memcpy(secret, s, secret_len);
}

static void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ================================================================== server */
typedef struct {
    int fd, stage, closing;                 /* stage: 0 HELLO, 1 PROOF, 2 authenticated */
    uint8_t cn[NONCE_LEN], sn[NONCE_LEN], key[MAC_LEN];
    uint64_t rx_seq, tx_seq;
    uint8_t *rbuf;
    size_t rlen;
    uint8_t *wbuf;
    size_t wlen, wcap;
    int want_out;
} conn_t;

static conn_t *conns[MAX_FD];
static volatile sig_atomic_t stop_flag;
static uint64_t n_grants, n_frames, n_completes, n_conns, n_errors;
static int lease_ms = 10000;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void wreserve(conn_t *c, size_t more) {
    if (c->wlen + more <= c->wcap) return;
    size_t cap = c->wcap ? c->wcap : 4096;
    while (cap < c->wlen + more) cap *= 2;
    c->wbuf = realloc(c->wbuf, cap);
    if (!c->wbuf) die("realloc");
    c->wcap = cap;
}

static void wframe(conn_t *c, const uint8_t *body, size_t n) {
    wreserve(c, 4 + n);
    put_u32(c->wbuf + c->wlen, (uint32_t)n);
    memcpy(c->wbuf + c->wlen + 4, body, n);
    c->wlen += 4 + n;
}

#ifndef NO_OPENSSL
static void wsealed(conn_t *c, const uint8_t *payload, size_t n) {
    wreserve(c, 4 + n + MAC_LEN);
    c->wlen += seal(c->key, 'S', &c->tx_seq, payload, n, c->wbuf + c->wlen);
}

/* one frame body of an arbiter-protocol connection; returns -1 to close */
static int arbiter_frame(conn_t *c, const uint8_t *body, size_t len) {
    if (c->stage == 0) {                            /* HELLO -> CHALLENGE */
        if (len != 4 + NONCE_LEN || memcmp(body, MAGIC, 4)) return -1;
        memcpy(c->cn, body + 4, NONCE_LEN);
        if (getrandom(c->sn, NONCE_LEN, 0) != NONCE_LEN) die("getrandom");
        uint8_t ch[4 + NONCE_LEN];
        memcpy(ch, MAGIC, 4);
        memcpy(ch + 4, c->sn, NONCE_LEN);
        wframe(c, ch, sizeof ch);
        c->stage = 1;
        return 0;
    }
    if (c->stage == 1) {                            /* PROOF -> VERDICT */
        uint8_t cli[MAC_LEN], v[1 + MAC_LEN];
        hs_value("cli", c->cn, c->sn, cli);
        if (len != MAC_LEN || !mac_equal(cli, body)) {
            v[0] = 1;
            wframe(c, v, 1);
            c->closing = 1;
            return 0;
        }
        v[0] = 0;
        hs_value("srv", c->cn, c->sn, v + 1);
        hs_value("key", c->cn, c->sn, c->key);
        wframe(c, v, sizeof v);
        c->stage = 2;
        return 0;
    }
    long n = unseal(c->key, 'C', &c->rx_seq, body, len);
    if (n < 1) return -1;
    uint8_t out[256];
    switch (body[0]) {
    case T_REGISTER:
        out[0] = T_REGISTERED;
        put_u32(out + 1, (uint32_t)lease_ms);
        wsealed(c, out, 5);
        return 0;
    case T_REQUEST:
        if (n < 1 + 8 + 8 + 8 + 2) return -1;
        out[0] = T_GRANT;
        memcpy(out + 1, body + 1, 8);
        wsealed(c, out, 9);
        n_grants++;
        return 0;
    case T_COMPLETE: case T_CANCEL: case T_RENEW:
        if (n != 9) return -1;
        n_completes++;
        return 0;
    case T_PING:
        if (n != 9) return -1;
        out[0] = T_PONG;
        memcpy(out + 1, body + 1, 8);
        wsealed(c, out, 9);
        return 0;
    case T_STATS: {
        int k = snprintf((char *)out + 2, sizeof out - 2,
                         "{\"links\": {\"link0\": {\"grants\": %llu}}, \"server\": {\"native\": 1}}",
                         (unsigned long long)n_grants);
        out[0] = T_STATS_REPLY;
        out[1] = 0;
        wsealed(c, out, 2 + (size_t)k);
        return 0;
    }
    default:
        return -1;
    }
}
#endif

static void conn_close(int ep, conn_t *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    conns[c->fd] = NULL;
    free(c->rbuf);
    free(c->wbuf);
    free(c);
}

/* send what is queued; -1: the connection failed */
static int conn_flush(int ep, conn_t *c) {
    size_t off = 0;
    while (off < c->wlen) {
        ssize_t k = send(c->fd, c->wbuf + off, c->wlen - off, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) break;
            return -1;
        }
        off += (size_t)k;
    }
    memmove(c->wbuf, c->wbuf + off, c->wlen - off);
    c->wlen -= off;
    int want = c->wlen > 0;
    if (want != c->want_out) {
        struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_out = want;
    }
    return 0;
}

/* one recv(), every complete frame handled, replies sent in one send(); -1: close
 * (bad frame or socket error), -2: closed by the peer */
static int conn_readable(conn_t *c) {
    ssize_t k = recv(c->fd, c->rbuf + c->rlen, 4 + MAX_FRAME - c->rlen, 0);
    if (k == 0) return -2;
    if (k < 0) return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
    c->rlen += (size_t)k;
    size_t pos = 0;
    while (c->rlen - pos >= 4) {
        uint32_t len = get_u32(c->rbuf + pos);
        if (len == 0 || len > MAX_FRAME) return -1;
        if (c->rlen - pos - 4 < len) break;
        const uint8_t *body = c->rbuf + pos + 4;
        n_frames++;
        if (proto_arbiter) {
#ifndef NO_OPENSSL
            if (arbiter_frame(c, body, len) < 0) return -1;
#endif
        } else {
            wframe(c, body, len);
        }
        pos += 4 + len;
    }
    memmove(c->rbuf, c->rbuf + pos, c->rlen - pos);
    c->rlen -= pos;
    return 0;
}

static int run_server(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;                      /* no SA_RESTART: epoll_wait returns EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (ls < 0) die("socket");
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    if (listen(ls, 256) < 0) die("listen");
    socklen_t al = sizeof a;
    getsockname(ls, (struct sockaddr *)&a, &al);
    printf("rtt_native %s server listening on 127.0.0.1:%d\n", proto_arbiter ? "arbiter" : "echo",
           ntohs(a.sin_port));
    fflush(stdout);

    int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    struct epoll_event evs[64];
    double cpu0 = cpu_seconds();
    while (!stop_flag) {
        int n = epoll_wait(ep, evs, 64, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (c == NULL) {                        /* accept everything pending */
                int fd;
                while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (fd >= MAX_FD) { close(fd); continue; }
                    nodelay(fd);
                    c = calloc(1, sizeof *c);
                    if (!c || !(c->rbuf = malloc(4 + MAX_FRAME))) die("malloc");
                    c->fd = fd;
                    conns[fd] = c;
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                    n_conns++;
                }
                continue;
            }
            int bad = 0;
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                bad = conn_readable(c);
            if (!bad && (c->wlen || (evs[i].events & EPOLLOUT)))
                bad = conn_flush(ep, c);
            if (bad == -1) n_errors++;
            if (bad || (c->closing && c->wlen == 0))
                conn_close(ep, c);
        }
    }
    printf("{\"grants\": %llu, \"frames\": %llu, \"completes\": %llu, \"connections\": %llu, "
           "\"closed_on_error\": %llu, \"cpu_seconds\": %.6f}\n",
           (unsigned long long)n_grants, (unsigned long long)n_frames,
           (unsigned long long)n_completes, (unsigned long long)n_conns,
           (unsigned long long)n_errors, cpu_seconds() - cpu0);
    fflush(stdout);
    return 0;
}

/* ================================================================== client */
static int read_full(int fd, uint8_t *p, size_t n) {
    while (n) {
        ssize_t k = recv(fd, p, n, 0);
        if (k == 0) return -1;
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int write_full(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* one frame body into buf (blocking); returns its length or -1 */
static long read_frame(int fd, uint8_t *buf) {
    uint8_t h[4];
    if (read_full(fd, h, 4)) return -1;
    uint32_t len = get_u32(h);
    if (len == 0 || len > MAX_FRAME) return -1;
    if (read_full(fd, buf, len)) return -1;
    return (long)len;
}

typedef struct {
    int fd;
    uint8_t key[MAC_LEN];
    uint64_t tx_seq, rx_seq;
    /* I/O-thread hand-off */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t want_token, t_deliver;
    int delivered, failed, stop;
} job_t;

/* wait for one reply; *token = its token (arbiter: a verified GRANT). 0, or -1 on failure */
static int recv_reply(job_t *j, uint64_t *token) {
    static __thread uint8_t body[MAX_FRAME];
    long len = read_frame(j->fd, body);
    if (len < 0) return -1;
    *token = 0;
    if (!proto_arbiter) return 0;
#ifndef NO_OPENSSL
    long n = unseal(j->key, 'S', &j->rx_seq, body, (size_t)len);
    if (n != 9 || body[0] != T_GRANT) return -1;
    *token = get_u64(body + 1);
#endif
    return 0;
}

static int send_request(job_t *j, uint64_t token) {
    uint8_t p[64], out[128];
    size_t n;
    if (!proto_arbiter) {                           /* 48 bytes, like the Python echo job */
        memset(out + 4, 'x', 48);
        put_u32(out, 48);
        return write_full(j->fd, out, 52);
    }
#ifndef NO_OPENSSL
    p[0] = T_REQUEST;
    put_u64(p + 1, token);
    put_u64(p + 9, 100 + token % 7);               /* priority, as the Python jobs ask */
    put_u64(p + 17, 1u << 16);                      /* nbytes */
    char label[8];
    int ll = snprintf(label, sizeof label, "c%d", (int)(token % 64));
    p[25] = 0;
    p[26] = (uint8_t)ll;
    memcpy(p + 27, label, (size_t)ll);
    n = seal(j->key, 'C', &j->tx_seq, p, 27 + (size_t)ll, out);
    return write_full(j->fd, out, n);
#else
    (void)p; (void)n; (void)token;
    return -1;
#endif
}

static int send_complete(job_t *j, uint64_t token) {
    if (!proto_arbiter) return 0;
#ifndef NO_OPENSSL
    uint8_t p[9], out[64];
    p[0] = T_COMPLETE;
    put_u64(p + 1, token);
    size_t n = seal(j->key, 'C', &j->tx_seq, p, 9, out);
    return write_full(j->fd, out, n);
#else
    (void)j; (void)token;
    return -1;
#endif
}

static int connect_job(job_t *j, int port, const char *job_id, const char *link) {
    j->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (j->fd < 0) return -1;
    nodelay(j->fd);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(j->fd, (struct sockaddr *)&a, sizeof a) < 0) return -1;
    if (!proto_arbiter) return 0;
#ifndef NO_OPENSSL
    uint8_t buf[512], cn[NONCE_LEN], sn[NONCE_LEN];
    if (getrandom(cn, NONCE_LEN, 0) != NONCE_LEN) return -1;
    memcpy(buf, MAGIC, 4);
    memcpy(buf + 4, cn, NONCE_LEN);
    uint8_t fr[600];
    put_u32(fr, 4 + NONCE_LEN);
    memcpy(fr + 4, buf, 4 + NONCE_LEN);
    if (write_full(j->fd, fr, 8 + NONCE_LEN)) return -1;
    long len = read_frame(j->fd, buf);                      /* CHALLENGE */
    if (len != 4 + NONCE_LEN || memcmp(buf, MAGIC, 4)) return -1;
    memcpy(sn, buf + 4, NONCE_LEN);
    uint8_t cli[MAC_LEN], srv[MAC_LEN];
    hs_value("cli", cn, sn, cli);
    hs_value("srv", cn, sn, srv);
    hs_value("key", cn, sn, j->key);
    put_u32(fr, MAC_LEN);                                   /* PROOF, REGISTER right behind */
    memcpy(fr + 4, cli, MAC_LEN);
    size_t n = 4 + MAC_LEN;
    uint8_t reg[600];
    size_t jl = strlen(job_id), kl = strlen(link), r = 0;
    reg[r++] = T_REGISTER;
    reg[r++] = (uint8_t)(jl >> 8); reg[r++] = (uint8_t)jl; memcpy(reg + r, job_id, jl); r += jl;
    reg[r++] = (uint8_t)(kl >> 8); reg[r++] = (uint8_t)kl; memcpy(reg + r, link, kl); r += kl;
    put_u32(reg + r, 0); r += 4;                            /* job class 0 */
    n += seal(j->key, 'C', &j->tx_seq, reg, r, fr + n);
    if (write_full(j->fd, fr, n)) return -1;
    len = read_frame(j->fd, buf);                           /* VERDICT */
    if (len != 1 + MAC_LEN || buf[0] != 0 || !mac_equal(buf + 1, srv)) return -1;
    len = read_frame(j->fd, buf);                           /* REGISTERED */
    if (len < 0) return -1;
    long pn = unseal(j->key, 'S', &j->rx_seq, buf, (size_t)len);
    if (pn != 5 || buf[0] != T_REGISTERED) return -1;
    return 0;
#else
    (void)job_id; (void)link;
    return -1;
#endif
}

static void *io_thread(void *arg) {
    job_t *j = arg;
    for (;;) {
        uint64_t token;
        /* the socket is blocking: the thread sleeps in recv until a reply arrives */
        int bad = recv_reply(j, &token);
        uint64_t t = now_ns();
        pthread_mutex_lock(&j->mu);
        if (j->stop) { pthread_mutex_unlock(&j->mu); return NULL; }
        j->failed = bad || (proto_arbiter && token != j->want_token);
        j->t_deliver = t;
        j->delivered = 1;
        pthread_cond_signal(&j->cv);
        bad = j->failed;
        pthread_mutex_unlock(&j->mu);
        if (bad) return NULL;
    }
}

static int run_job(int idx, int port, int samples, int warmup, long interval_us, int use_thread,
                   const char *link, uint64_t *rtts, double *cpu, int ready_w, int start_r) {
    job_t j;
    memset(&j, 0, sizeof j);
    char job_id[32];
    snprintf(job_id, sizeof job_id, "native%d", idx);
    int ok = connect_job(&j, port, job_id, link) == 0;
    uint8_t b = ok ? 1 : 0;
    if (write(ready_w, &b, 1) != 1 || !ok) return 1;
    if (read(start_r, &b, 1) < 0) return 1;                 /* EOF: everyone is connected */
    pthread_t th;
    if (use_thread) {
        pthread_mutex_init(&j.mu, NULL);
        pthread_cond_init(&j.cv, NULL);
        j.want_token = 0;
        if (pthread_create(&th, NULL, io_thread, &j)) return 1;
    }
    struct timespec sl = {.tv_sec = interval_us / 1000000, .tv_nsec = (interval_us % 1000000) * 1000};
    double c0 = cpu_seconds();
    for (int i = 0; i < warmup + samples; i++) {
        uint64_t token = (uint64_t)i, t1;
        if (use_thread) {
            pthread_mutex_lock(&j.mu);
            j.want_token = token;
            j.delivered = 0;
            pthread_mutex_unlock(&j.mu);
        }
        uint64_t t0 = now_ns();
        if (send_request(&j, token)) return 1;
        if (use_thread) {
            pthread_mutex_lock(&j.mu);
            while (!j.delivered) pthread_cond_wait(&j.cv, &j.mu);
            t1 = j.t_deliver;
            int failed = j.failed;
            pthread_mutex_unlock(&j.mu);
            if (failed) return 1;
        } else {
            uint64_t got;
            if (recv_reply(&j, &got) || (proto_arbiter && got != token)) return 1;
            t1 = now_ns();
        }
        if (i >= warmup) rtts[i - warmup] = t1 - t0;
        if (send_complete(&j, token)) return 1;
        if (interval_us > 0) clock_nanosleep(CLOCK_MONOTONIC, 0, &sl, NULL);
    }
    *cpu = cpu_seconds() - c0;
    if (use_thread) {
        pthread_mutex_lock(&j.mu);
        j.stop = 1;
        pthread_mutex_unlock(&j.mu);
        shutdown(j.fd, SHUT_RDWR);                          /* wakes the thread out of recv */
        pthread_join(th, NULL);
    }
    close(j.fd);
    return 0;
}

static int run_client(int port, int jobs, int samples, int warmup, long interval_us, int use_thread,
                      const char *link) {
    size_t per = (size_t)samples;
    size_t bytes = sizeof(uint64_t) * per * (size_t)jobs + sizeof(double) * (size_t)jobs +
                   sizeof(int) * (size_t)jobs;
    uint8_t *shm = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shm == MAP_FAILED) die("mmap");
    uint64_t *rtts = (uint64_t *)shm;
    double *cpu = (double *)(rtts + per * (size_t)jobs);
    int *status = (int *)(cpu + jobs);
    int ready[2], start[2];
    if (pipe(ready) || pipe(start)) die("pipe");
    pid_t *pids = calloc((size_t)jobs, sizeof(pid_t));
    for (int i = 0; i < jobs; i++) {
        pid_t p = fork();
        if (p < 0) die("fork");
        if (p == 0) {
            close(ready[0]);
            close(start[1]);
            int rc = run_job(i, port, samples, warmup, interval_us, use_thread, link,
                             rtts + per * (size_t)i, cpu + i, ready[1], start[0]);
            status[i] = rc ? 1 : 2;
            _exit(rc);
        }
        pids[i] = p;
    }
    close(ready[1]);
    close(start[0]);
    int connected = 0;
    for (int i = 0; i < jobs; i++) {
        uint8_t b;
        if (read(ready[0], &b, 1) == 1 && b == 1) connected++;
    }
    usleep(200000);
    close(start[1]);                                        /* start them all */
    for (int i = 0; i < jobs; i++) waitpid(pids[i], NULL, 0);
    printf("{\"connected\": %d, \"errors\": [", connected);
    int first = 1;
    for (int i = 0; i < jobs; i++) {
        if (status[i] != 2) {
            printf("%s\"native job %d failed\"", first ? "" : ", ", i);
            first = 0;
        }
    }
    printf("], \"cpu_s\": [");
    first = 1;
    for (int i = 0; i < jobs; i++) {
        if (status[i] != 2) continue;
        printf("%s%.6f", first ? "" : ", ", cpu[i]);
        first = 0;
    }
    printf("], \"rtt_ns\": [");
    first = 1;
    for (int i = 0; i < jobs; i++) {
        if (status[i] != 2) continue;
        for (size_t k = 0; k < per; k++) {
            printf("%s%llu", first ? "" : ",", (unsigned long long)rtts[per * (size_t)i + k]);
            first = 0;
        }
    }
    printf("]}\n");
    return connected == jobs ? 0 : 1;
}

/* ================================================================== main */
static void usage(void) {
    fprintf(stderr, "usage: rtt_native server|client --proto arbiter|echo [--port P] [--jobs N] "
                    "[--samples S] [--warmup W] [--interval-us U] [--io-thread] [--secret S] "
                    "[--link L] [--lease-ms N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    if (strcmp(argv[1], "features") == 0) {                /* what this build can do */
#ifdef NO_OPENSSL
        printf("hmac none\n");
#else
        printf("hmac openssl\n");
#endif
        return 0;
    }
    int server = strcmp(argv[1], "server") == 0;
    if (!server && strcmp(argv[1], "client") != 0) usage();
    int port = 0, jobs = 8, samples = 2000, warmup = 200, use_thread = 0;
    long interval_us = 1000;
    const char *link = "link0";
    load_secret("benchmark-secret");
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--io-thread")) { use_thread = 1; continue; }
        if (!v) usage();
        if (!strcmp(a, "--proto")) {
            if (!strcmp(v, "arbiter")) proto_arbiter = 1;
            else if (!strcmp(v, "echo")) proto_arbiter = 0;
            else usage();
        } else if (!strcmp(a, "--port")) port = atoi(v);
        else if (!strcmp(a, "--jobs")) jobs = atoi(v);
        else if (!strcmp(a, "--samples")) samples = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--interval-us")) interval_us = atol(v);
        else if (!strcmp(a, "--secret")) load_secret(v);
        else if (!strcmp(a, "--link")) link = v;
        else if (!strcmp(a, "--lease-ms")) lease_ms = atoi(v);
        else usage();
        i++;
    }
#ifdef NO_OPENSSL
    if (proto_arbiter) {
        fprintf(stderr, "rtt_native: built without OpenSSL; only --proto echo\n");
        return 3;
    }
#endif
    if (jobs < 1 || samples < 1 || warmup < 0 || interval_us < 0 || (!server && port <= 0)) usage();
    return server ? run_server() : run_client(port, jobs, samples, warmup, interval_us, use_thread,
                                              link);
}
