/*
 * gpuyard-web: the test workload of the offline "web" image (devtools/web_image.py).
 *
 * A small HTTP/1.1 server with keep-alive, one forked process per connection:
 *
 *   GET  /                                 an HTML page naming the host
 *   GET  /bytes/N                          N bytes (byte i is i % 256)
 *   GET  /stream?seconds=S&interval=I      chunked text, one line every I s for S s
 *                                          (lines at t = 0, I, 2I, ... <= S)
 *   POST /echo                             the request body streamed back (sized or
 *                                          chunked, as the request was)
 *   POST /count                            reads the whole body, then answers
 *                                          "bytes=N fnv1a64=HEX" (uploads through
 *                                          half-duplex proxies)
 *   GET  /ws                               a WebSocket echo server (RFC 6455)
 *   GET  /healthz                          "ok"
 *   GET  /headers                          the request's header lines as received
 *                                          (what a proxy let through)
 *
 * Usage: gpuyard-web [PORT]   (default $PORT, else 8888). SIGTERM/SIGINT end it at
 * once; connection processes die with it (PR_SET_PDEATHSIG), so a container running it
 * as PID 1 stops in milliseconds. WEB_LOG=1 logs one line per request on stdout.
 *
 * Built with `gcc -O2 -static` when the image is built, so it needs no libraries in
 * the image. SHA-1 and base64 (for the WebSocket handshake) are written out here.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_PORT 8888
#define HEAD_MAX 16384       /* request line + headers */
#define IO_CHUNK (256 * 1024) /* a multiple of 256: /bytes' pattern runs on */
#define IDLE_TIMEOUT_S 300   /* a keep-alive connection waiting for a request */

static int log_requests;

/* ------------------------------------------------------------------ SHA-1 */

struct sha1 {
    uint32_t h[5];
    uint64_t len;
    unsigned char block[64];
    size_t used;
};

static uint32_t rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static void sha1_block(struct sha1 *s, const unsigned char *p) {
    uint32_t w[80], a, b, c, d, e, f, k, t;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (i = 16; i < 80; i++) w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    a = s->h[0]; b = s->h[1]; c = s->h[2]; d = s->h[3]; e = s->h[4];
    for (i = 0; i < 80; i++) {
        if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999; }
        else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1; }
        else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDC; }
        else { f = b ^ c ^ d; k = 0xCA62C1D6; }
        t = rol(a, 5) + f + e + k + w[i];
        e = d; d = c; c = rol(b, 30); b = a; a = t;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d; s->h[4] += e;
}

static void sha1_init(struct sha1 *s) {
    s->h[0] = 0x67452301; s->h[1] = 0xEFCDAB89; s->h[2] = 0x98BADCFE;
    s->h[3] = 0x10325476; s->h[4] = 0xC3D2E1F0;
    s->len = 0; s->used = 0;
}

static void sha1_update(struct sha1 *s, const void *data, size_t n) {
    const unsigned char *p = data;
    s->len += n;
    while (n > 0) {
        size_t take = 64 - s->used;
        if (take > n) take = n;
        memcpy(s->block + s->used, p, take);
        s->used += take; p += take; n -= take;
        if (s->used == 64) { sha1_block(s, s->block); s->used = 0; }
    }
}

static void sha1_final(struct sha1 *s, unsigned char out[20]) {
    uint64_t bits = s->len * 8;
    unsigned char pad = 0x80, zero = 0, lenb[8];
    int i;
    sha1_update(s, &pad, 1);
    while (s->used != 56) sha1_update(s, &zero, 1);
    for (i = 0; i < 8; i++) lenb[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha1_update(s, lenb, 8);
    for (i = 0; i < 20; i++) out[i] = (unsigned char)(s->h[i / 4] >> (24 - 8 * (i % 4)));
}

static void base64(const unsigned char *in, size_t n, char *out) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i;
    for (i = 0; i + 2 < n; i += 3) {
        *out++ = tab[in[i] >> 2];
        *out++ = tab[(in[i] & 3) << 4 | in[i + 1] >> 4];
        *out++ = tab[(in[i + 1] & 15) << 2 | in[i + 2] >> 6];
        *out++ = tab[in[i + 2] & 63];
    }
    if (i < n) {
        *out++ = tab[in[i] >> 2];
        if (i + 1 < n) {
            *out++ = tab[(in[i] & 3) << 4 | in[i + 1] >> 4];
            *out++ = tab[(in[i + 1] & 15) << 2];
        } else {
            *out++ = tab[(in[i] & 3) << 4];
            *out++ = '=';
        }
        *out++ = '=';
    }
    *out = 0;
}

/* ------------------------------------------------------------ connection I/O */

struct conn {
    int fd;
    char in[HEAD_MAX];
    size_t start, end; /* buffered, unread bytes: in[start..end) */
};

static unsigned char io[IO_CHUNK];      /* what is read and sent back */
static unsigned char pattern[IO_CHUNK]; /* /bytes' content: byte i is i % 256 */

static int send_all(int fd, const void *data, size_t n, int more) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | (more ? MSG_MORE : 0));
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w; n -= (size_t)w;
    }
    return 0;
}

/* Up to n bytes, buffered ones first; 0 at EOF, -1 on error or timeout. */
static ssize_t conn_read(struct conn *c, void *dst, size_t n) {
    if (c->end > c->start) {
        size_t have = c->end - c->start;
        if (have > n) have = n;
        memcpy(dst, c->in + c->start, have);
        c->start += have;
        return (ssize_t)have;
    }
    for (;;) {
        ssize_t r = recv(c->fd, dst, n, 0);
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

static int conn_read_exact(struct conn *c, void *dst, size_t n) {
    char *p = dst;
    while (n > 0) {
        ssize_t r = conn_read(c, p, n);
        if (r <= 0) return -1;
        p += r; n -= (size_t)r;
    }
    return 0;
}

/* Read more into the buffer (moving what is unread to its front first). */
static ssize_t conn_fill(struct conn *c) {
    if (c->start > 0) {
        memmove(c->in, c->in + c->start, c->end - c->start);
        c->end -= c->start;
        c->start = 0;
    }
    if (c->end >= sizeof c->in - 1) return -2;
    for (;;) {
        ssize_t r = recv(c->fd, c->in + c->end, sizeof c->in - 1 - c->end, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r > 0) c->end += (size_t)r;
        return r;
    }
}

/* One CRLF- (or LF-) terminated line into out (NUL-terminated, without the EOL). */
static int conn_line(struct conn *c, char *out, size_t cap) {
    for (;;) {
        char *nl = memchr(c->in + c->start, '\n', c->end - c->start);
        if (nl) {
            size_t n = (size_t)(nl - (c->in + c->start));
            if (n > 0 && nl[-1] == '\r') n--;
            if (n >= cap) return -1;
            memcpy(out, c->in + c->start, n);
            out[n] = 0;
            c->start = (size_t)(nl - c->in) + 1;
            return 0;
        }
        if (conn_fill(c) <= 0) return -1;
    }
}

static void set_recv_timeout(int fd, int seconds) {
    struct timeval tv = {seconds, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* ---------------------------------------------------------------- requests */

struct request {
    char method[16];
    char target[2048];
    char path[2048];
    const char *query;
    int http10;
    long long content_length; /* -1: none */
    int chunked;
    int keep_alive;
    int upgrade_ws;
    int conn_upgrade;
    int expect_continue;
    char ws_key[128];
    char ws_version[16];
    char content_type[256];
    char headers[HEAD_MAX]; /* the header lines as received, CRLF-separated */
};

static int token_in(const char *value, const char *token) {
    size_t n = strlen(token);
    const char *p = value;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (strncasecmp(p, token, n) == 0 && (p[n] == 0 || p[n] == ',' || p[n] == ' ' ||
                                              p[n] == '\t' || p[n] == ';'))
            return 1;
        while (*p && *p != ',') p++;
    }
    return 0;
}

static void copy_trimmed(char *dst, size_t cap, const char *src) {
    size_t n;
    while (*src == ' ' || *src == '\t') src++;
    n = strlen(src);
    while (n > 0 && (src[n - 1] == ' ' || src[n - 1] == '\t')) n--;
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* 1: a request was read; 0: the peer closed between requests; -1: bad or too big. */
static int read_request(struct conn *c, struct request *rq) {
    char *head, *end, *line, *next;
    size_t head_len;
    for (;;) {
        end = memmem(c->in + c->start, c->end - c->start, "\r\n\r\n", 4);
        if (end) break;
        ssize_t r = conn_fill(c);
        if (r == 0 && c->end == c->start) return 0;
        if (r <= 0) return r == -2 ? -1 : (c->end == c->start ? 0 : -1);
    }
    head = c->in + c->start;
    head_len = (size_t)(end - head);
    head[head_len] = 0; /* overwrites the first \r of the blank line */
    c->start += head_len + 4;

    memset(rq, 0, sizeof *rq);
    rq->content_length = -1;
    line = head;
    next = strstr(line, "\r\n");
    if (next) {
        size_t n = head_len - (size_t)(next + 2 - head);
        if (n >= sizeof rq->headers) n = sizeof rq->headers - 1;
        memcpy(rq->headers, next + 2, n);
        rq->headers[n] = 0;
    }
    if (next) *next = 0;
    {
        char version[16];
        if (sscanf(line, "%15s %2047s %15s", rq->method, rq->target, version) != 3) return -1;
        if (strncmp(version, "HTTP/1.", 7) != 0) return -1;
        rq->http10 = strcmp(version, "HTTP/1.0") == 0;
    }
    rq->keep_alive = !rq->http10;
    while (next) {
        char *colon;
        line = next + 2;
        next = strstr(line, "\r\n");
        if (next) *next = 0;
        colon = strchr(line, ':');
        if (!colon) continue;
        *colon = 0;
        const char *value = colon + 1;
        while (*value == ' ' || *value == '\t') value++;
        if (strcasecmp(line, "Content-Length") == 0) {
            char *stop;
            rq->content_length = strtoll(value, &stop, 10);
            if (stop == value || rq->content_length < 0) return -1;
        } else if (strcasecmp(line, "Transfer-Encoding") == 0) {
            rq->chunked = token_in(value, "chunked");
        } else if (strcasecmp(line, "Connection") == 0) {
            if (token_in(value, "close")) rq->keep_alive = 0;
            if (token_in(value, "keep-alive")) rq->keep_alive = 1;
            if (token_in(value, "upgrade")) rq->conn_upgrade = 1;
        } else if (strcasecmp(line, "Upgrade") == 0) {
            rq->upgrade_ws = token_in(value, "websocket");
        } else if (strcasecmp(line, "Sec-WebSocket-Key") == 0) {
            copy_trimmed(rq->ws_key, sizeof rq->ws_key, value);
        } else if (strcasecmp(line, "Sec-WebSocket-Version") == 0) {
            copy_trimmed(rq->ws_version, sizeof rq->ws_version, value);
        } else if (strcasecmp(line, "Expect") == 0) {
            rq->expect_continue = token_in(value, "100-continue");
        } else if (strcasecmp(line, "Content-Type") == 0) {
            copy_trimmed(rq->content_type, sizeof rq->content_type, value);
        }
    }
    if (rq->chunked) rq->content_length = -1;
    {
        char *q = strchr(rq->target, '?');
        size_t n = q ? (size_t)(q - rq->target) : strlen(rq->target);
        memcpy(rq->path, rq->target, n);
        rq->path[n] = 0;
        rq->query = q ? q + 1 : "";
    }
    return 1;
}

static int has_body(const struct request *rq) { return rq->chunked || rq->content_length > 0; }

static const char *query_param(const char *query, const char *name, char *out, size_t cap) {
    size_t n = strlen(name);
    const char *p = query;
    while (*p) {
        if (strncmp(p, name, n) == 0 && p[n] == '=') {
            const char *v = p + n + 1;
            size_t len = strcspn(v, "&");
            if (len >= cap) len = cap - 1;
            memcpy(out, v, len);
            out[len] = 0;
            return out;
        }
        p = strchr(p, '&');
        if (!p) break;
        p++;
    }
    return NULL;
}

static int respond_head(int fd, int status, const char *reason, const char *type,
                        long long length, int keep, const char *extra) {
    char h[1024];
    int n = snprintf(h, sizeof h,
                     "HTTP/1.1 %d %s\r\nServer: gpuyard-web\r\nContent-Type: %s\r\n", status,
                     reason, type);
    if (length >= 0)
        n += snprintf(h + n, sizeof h - (size_t)n, "Content-Length: %lld\r\n", length);
    else
        n += snprintf(h + n, sizeof h - (size_t)n, "Transfer-Encoding: chunked\r\n");
    n += snprintf(h + n, sizeof h - (size_t)n, "Connection: %s\r\n%s\r\n",
                  keep ? "keep-alive" : "close", extra ? extra : "");
    return send_all(fd, h, (size_t)n, 1);
}

static int respond(int fd, int status, const char *reason, const char *type, const char *body,
                   int keep, int head_only, const char *extra) {
    size_t n = strlen(body);
    if (respond_head(fd, status, reason, type, (long long)n, keep, extra) < 0) return -1;
    if (head_only) return send_all(fd, "", 0, 0);
    return send_all(fd, body, n, 0);
}

static int send_chunk(int fd, const void *data, size_t n) {
    char size[32];
    int k = snprintf(size, sizeof size, "%zx\r\n", n);
    if (send_all(fd, size, (size_t)k, 1) < 0) return -1;
    if (send_all(fd, data, n, 1) < 0) return -1;
    return send_all(fd, "\r\n", 2, 0);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_until(double when) {
    for (;;) {
        double left = when - now_s();
        if (left <= 0) return;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* ------------------------------------------------------------------ routes */

static int route_index(struct conn *c, const struct request *rq, int head_only) {
    char host[256] = "unknown", safe[1024], page[2048];
    size_t i, j = 0;
    gethostname(host, sizeof host - 1);
    for (i = 0; host[i] && j < sizeof safe - 8; i++) {
        if (host[i] == '<') { memcpy(safe + j, "&lt;", 4); j += 4; }
        else if (host[i] == '>') { memcpy(safe + j, "&gt;", 4); j += 4; }
        else if (host[i] == '&') { memcpy(safe + j, "&amp;", 5); j += 5; }
        else safe[j++] = host[i];
    }
    safe[j] = 0;
    snprintf(page, sizeof page,
             "<!doctype html>\n<html><head><title>gpuyard web</title></head>\n"
             "<body><h1>gpuyard web test server</h1>\n<p>host: %s</p></body></html>\n",
             safe);
    return respond(c->fd, 200, "OK", "text/html; charset=utf-8", page, rq->keep_alive,
                   head_only, NULL);
}

static int route_bytes(struct conn *c, const struct request *rq, const char *arg,
                       int head_only) {
    char *stop;
    unsigned long long n;
    if (*arg < '0' || *arg > '9')
        return respond(c->fd, 400, "Bad Request", "text/plain", "bad byte count\n", 0, 0, NULL);
    errno = 0;
    n = strtoull(arg, &stop, 10);
    if (*stop || errno || n > (1ULL << 50))
        return respond(c->fd, 400, "Bad Request", "text/plain", "bad byte count\n", 0, 0, NULL);
    if (respond_head(c->fd, 200, "OK", "application/octet-stream", (long long)n,
                     rq->keep_alive, NULL) < 0)
        return -1;
    if (head_only) return send_all(c->fd, "", 0, 0);
    while (n > 0) {
        size_t take = n > IO_CHUNK ? IO_CHUNK : (size_t)n;
        if (send_all(c->fd, pattern, take, 0) < 0) return -1;
        n -= take;
    }
    return 0;
}

static int route_stream(struct conn *c, const struct request *rq) {
    char v[64], line[128];
    double seconds = 10, interval = 1, start;
    long long i, lines;
    if (query_param(rq->query, "seconds", v, sizeof v)) seconds = strtod(v, NULL);
    if (query_param(rq->query, "interval", v, sizeof v)) interval = strtod(v, NULL);
    if (!(seconds >= 0) || !(interval >= 0.001) || seconds / interval > 10000000)
        return respond(c->fd, 400, "Bad Request", "text/plain",
                       "seconds >= 0 and interval >= 0.001 please\n", 0, 0, NULL);
    lines = (long long)(seconds / interval + 1e-9) + 1;
    if (respond_head(c->fd, 200, "OK", "text/plain; charset=utf-8", -1, rq->keep_alive,
                     "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n") < 0)
        return -1;
    start = now_s();
    for (i = 0; i < lines; i++) {
        sleep_until(start + (double)i * interval);
        int n = snprintf(line, sizeof line, "line %lld t=%.3f\n", i, now_s() - start);
        if (send_chunk(c->fd, line, (size_t)n) < 0) return -1;
    }
    return send_all(c->fd, "0\r\n\r\n", 5, 0);
}

static int route_echo(struct conn *c, const struct request *rq) {
    const char *type = rq->content_type[0] ? rq->content_type : "application/octet-stream";
    if (rq->expect_continue && has_body(rq) &&
        send_all(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, 0) < 0)
        return -1;
    if (!rq->chunked) {
        long long left = rq->content_length > 0 ? rq->content_length : 0;
        if (respond_head(c->fd, 200, "OK", type, left, rq->keep_alive, NULL) < 0) return -1;
        if (left == 0) return send_all(c->fd, "", 0, 0);
        while (left > 0) {
            ssize_t r = conn_read(c, io, left > IO_CHUNK ? IO_CHUNK : (size_t)left);
            if (r <= 0) return -1;
            if (send_all(c->fd, io, (size_t)r, 0) < 0) return -1;
            left -= r;
        }
        return 0;
    }
    if (respond_head(c->fd, 200, "OK", type, -1, rq->keep_alive, NULL) < 0) return -1;
    for (;;) {
        char line[256], *stop;
        unsigned long long size;
        if (conn_line(c, line, sizeof line) < 0) return -1;
        size = strtoull(line, &stop, 16);
        if (stop == line) return -1;
        if (size == 0) break;
        {
            char head[32];
            int k = snprintf(head, sizeof head, "%llx\r\n", size);
            if (send_all(c->fd, head, (size_t)k, 1) < 0) return -1;
        }
        while (size > 0) {
            ssize_t r = conn_read(c, io, size > IO_CHUNK ? IO_CHUNK : (size_t)size);
            if (r <= 0) return -1;
            if (send_all(c->fd, io, (size_t)r, 1) < 0) return -1;
            size -= (unsigned long long)r;
        }
        if (send_all(c->fd, "\r\n", 2, 0) < 0) return -1;
        if (conn_line(c, line, sizeof line) < 0 || line[0]) return -1;
    }
    for (;;) { /* trailers, up to the blank line */
        char line[1024];
        if (conn_line(c, line, sizeof line) < 0) return -1;
        if (!line[0]) break;
    }
    return send_all(c->fd, "0\r\n\r\n", 5, 0);
}

/* The whole body (sized or chunked) is read before anything is answered. */
static int route_count(struct conn *c, const struct request *rq) {
    uint64_t hash = 14695981039346656037ULL, total = 0;
    char answer[96];
    if (rq->expect_continue && has_body(rq) &&
        send_all(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, 0) < 0)
        return -1;
    if (!rq->chunked) {
        long long left = rq->content_length > 0 ? rq->content_length : 0;
        while (left > 0) {
            ssize_t r = conn_read(c, io, left > IO_CHUNK ? IO_CHUNK : (size_t)left);
            ssize_t i;
            if (r <= 0) return -1;
            for (i = 0; i < r; i++) hash = (hash ^ (unsigned char)io[i]) * 1099511628211ULL;
            total += (uint64_t)r;
            left -= r;
        }
    } else {
        for (;;) {
            char line[256], *stop;
            unsigned long long size;
            if (conn_line(c, line, sizeof line) < 0) return -1;
            size = strtoull(line, &stop, 16);
            if (stop == line) return -1;
            if (size == 0) break;
            while (size > 0) {
                ssize_t r = conn_read(c, io, size > IO_CHUNK ? IO_CHUNK : (size_t)size);
                ssize_t i;
                if (r <= 0) return -1;
                for (i = 0; i < r; i++) hash = (hash ^ (unsigned char)io[i]) * 1099511628211ULL;
                total += (uint64_t)r;
                size -= (unsigned long long)r;
            }
            if (conn_line(c, line, sizeof line) < 0 || line[0]) return -1;
        }
        for (;;) {
            char line[1024];
            if (conn_line(c, line, sizeof line) < 0) return -1;
            if (!line[0]) break;
        }
    }
    snprintf(answer, sizeof answer, "bytes=%llu fnv1a64=%016llx\n", (unsigned long long)total,
             (unsigned long long)hash);
    return respond(c->fd, 200, "OK", "text/plain", answer, rq->keep_alive, 0, NULL);
}

/* ---------------------------------------------------------------- WebSocket */

static int ws_send(int fd, int fin_opcode, const void *data, uint64_t n, int more) {
    unsigned char h[10];
    size_t k = 2;
    h[0] = (unsigned char)fin_opcode;
    if (n < 126) {
        h[1] = (unsigned char)n;
    } else if (n < 65536) {
        h[1] = 126; h[2] = (unsigned char)(n >> 8); h[3] = (unsigned char)n; k = 4;
    } else {
        int i;
        h[1] = 127;
        for (i = 0; i < 8; i++) h[2 + i] = (unsigned char)(n >> (56 - 8 * i));
        k = 10;
    }
    if (send_all(fd, h, k, data != NULL ? 1 : more) < 0) return -1;
    return data ? send_all(fd, data, (size_t)n, more) : 0;
}

static void ws_close(int fd, int code) {
    unsigned char p[2] = {(unsigned char)(code >> 8), (unsigned char)code};
    ws_send(fd, 0x88, p, 2, 0);
}

static void ws_loop(struct conn *c) {
    int in_message = 0;
    set_recv_timeout(c->fd, 0);
    for (;;) {
        unsigned char h[2], ext[8], mask[4], ctl[125];
        uint64_t len, done = 0;
        int fin, op, i;
        if (conn_read_exact(c, h, 2) < 0) return;
        fin = h[0] & 0x80;
        op = h[0] & 0x0f;
        len = h[1] & 0x7f;
        if (len == 126) {
            if (conn_read_exact(c, ext, 2) < 0) return;
            len = (uint64_t)ext[0] << 8 | ext[1];
        } else if (len == 127) {
            if (conn_read_exact(c, ext, 8) < 0) return;
            for (len = 0, i = 0; i < 8; i++) len = len << 8 | ext[i];
        }
        if ((h[0] & 0x70) || !(h[1] & 0x80) || (len >> 63)) { ws_close(c->fd, 1002); return; }
        if (conn_read_exact(c, mask, 4) < 0) return;
        if (op >= 8) {
            if (!fin || len > 125) { ws_close(c->fd, 1002); return; }
            if (conn_read_exact(c, ctl, (size_t)len) < 0) return;
            for (i = 0; i < (int)len; i++) ctl[i] ^= mask[i % 4];
            if (op == 0x8) { /* close: answer with the peer's code, then hang up */
                if (len == 1) ws_close(c->fd, 1002);
                else ws_send(c->fd, 0x88, ctl, len >= 2 ? 2 : 0, 0);
                return;
            }
            if (op == 0x9) { if (ws_send(c->fd, 0x8A, ctl, len, 0) < 0) return; }
            else if (op != 0xA) { ws_close(c->fd, 1002); return; }
            continue;
        }
        if (op > 2 || (op == 0) != (in_message != 0)) { ws_close(c->fd, 1002); return; }
        in_message = !fin;
        /* Echo the frame as it came (opcode and FIN kept), its payload unmasked on the way. */
        if (ws_send(c->fd, (fin ? 0x80 : 0) | op, NULL, len, len > 0) < 0) return;
        while (done < len) {
            size_t take = len - done > IO_CHUNK ? IO_CHUNK : (size_t)(len - done);
            ssize_t r = conn_read(c, io, take);
            if (r <= 0) return;
            for (i = 0; i < (int)r; i++) io[i] ^= mask[(done + (uint64_t)i) % 4];
            done += (uint64_t)r;
            if (send_all(c->fd, io, (size_t)r, done < len) < 0) return;
        }
    }
}

static int route_ws(struct conn *c, const struct request *rq) {
    static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    unsigned char digest[20];
    char accept[32], h[256];
    struct sha1 s;
    int n;
    if (!rq->upgrade_ws || !rq->conn_upgrade || !rq->ws_key[0])
        return respond(c->fd, 400, "Bad Request", "text/plain",
                       "a WebSocket upgrade request, please\n", 0, 0, NULL);
    if (strcmp(rq->ws_version, "13") != 0)
        return respond(c->fd, 426, "Upgrade Required", "text/plain",
                       "WebSocket version 13 only\n", 0, 0, "Sec-WebSocket-Version: 13\r\n");
    sha1_init(&s);
    sha1_update(&s, rq->ws_key, strlen(rq->ws_key));
    sha1_update(&s, guid, sizeof guid - 1);
    sha1_final(&s, digest);
    base64(digest, 20, accept);
    n = snprintf(h, sizeof h,
                 "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                 "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
                 accept);
    if (send_all(c->fd, h, (size_t)n, 0) < 0) return -1;
    ws_loop(c);
    return -1; /* the connection is done */
}

/* ------------------------------------------------------------------ serving */

/* 0: keep the connection for the next request; -1: close it. */
static int handle(struct conn *c, struct request *rq) {
    int get = strcmp(rq->method, "GET") == 0, head = strcmp(rq->method, "HEAD") == 0;
    int rc;
    if (strcmp(rq->path, "/echo") == 0) {
        if (strcmp(rq->method, "POST") != 0 && strcmp(rq->method, "PUT") != 0) {
            respond(c->fd, 405, "Method Not Allowed", "text/plain", "POST please\n", 0, 0,
                    "Allow: POST, PUT\r\n");
            return -1;
        }
        rc = route_echo(c, rq);
    } else if (strcmp(rq->path, "/count") == 0 && strcmp(rq->method, "POST") == 0) {
        rc = route_count(c, rq);
    } else if (has_body(rq)) {
        /* No other route reads a body: answer and close rather than skip it. */
        respond(c->fd, 405, "Method Not Allowed", "text/plain", "no body here\n", 0, 0, NULL);
        return -1;
    } else if (!get && !head) {
        respond(c->fd, 405, "Method Not Allowed", "text/plain", "GET please\n", rq->keep_alive,
                0, "Allow: GET, HEAD\r\n");
        rc = 0;
    } else if (strcmp(rq->path, "/") == 0 || strcmp(rq->path, "/index.html") == 0) {
        rc = route_index(c, rq, head);
    } else if (strncmp(rq->path, "/bytes/", 7) == 0) {
        rc = route_bytes(c, rq, rq->path + 7, head);
    } else if (strcmp(rq->path, "/stream") == 0 && get) {
        rc = route_stream(c, rq);
    } else if (strcmp(rq->path, "/ws") == 0 && get) {
        return route_ws(c, rq);
    } else if (strcmp(rq->path, "/headers") == 0) {
        rc = respond(c->fd, 200, "OK", "text/plain", rq->headers, rq->keep_alive, head, NULL);
    } else if (strcmp(rq->path, "/healthz") == 0) {
        rc = respond(c->fd, 200, "OK", "text/plain", "ok\n", rq->keep_alive, head, NULL);
    } else {
        rc = respond(c->fd, 404, "Not Found", "text/plain", "not found\n", rq->keep_alive,
                     head, NULL);
    }
    return rc < 0 || !rq->keep_alive ? -1 : 0;
}

static void serve(int fd) {
    static struct conn c;
    struct request rq;
    int one = 1;
    c.fd = fd;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_recv_timeout(fd, IDLE_TIMEOUT_S);
    for (;;) {
        int r = read_request(&c, &rq);
        if (r == 0) break;
        if (r < 0) {
            respond(fd, 400, "Bad Request", "text/plain", "bad request\n", 0, 0, NULL);
            break;
        }
        int rc = handle(&c, &rq);
        if (log_requests) {
            printf("%s %s\n", rq.method, rq.target);
            fflush(stdout);
        }
        if (rc < 0) break;
    }
    close(fd);
}

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

static int listen_on(int port) {
    int one = 1, zero = 0, fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd >= 0) {
        struct sockaddr_in6 a6;
        memset(&a6, 0, sizeof a6);
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)port);
        a6.sin6_addr = in6addr_any;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0 && listen(fd, 512) == 0) return fd;
        close(fd);
    }
    /* No IPv6 in this network namespace: IPv4 only. */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a4;
    memset(&a4, 0, sizeof a4);
    a4.sin_family = AF_INET;
    a4.sin_port = htons((uint16_t)port);
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a4, sizeof a4) < 0 || listen(fd, 512) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int main(int argc, char **argv) {
    const char *p = argc > 1 ? argv[1] : getenv("PORT");
    int port = p && *p ? atoi(p) : DEFAULT_PORT, lfd, i;
    pid_t me = getpid();
    struct sigaction sa;
    const char *lg = getenv("WEB_LOG");
    log_requests = lg && *lg && strcmp(lg, "0") != 0;
    if (port <= 0 || port > 65535) {
        fprintf(stderr, "gpuyard-web: bad port %s\n", p);
        return 2;
    }
    for (i = 0; i < IO_CHUNK; i++) pattern[i] = (unsigned char)i;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term; /* no SA_RESTART: accept() returns to notice it */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGCHLD, SIG_IGN); /* connection processes are reaped by the kernel */

    lfd = listen_on(port);
    if (lfd < 0) {
        perror("gpuyard-web: listen");
        return 1;
    }
    printf("gpuyard-web listening on port %d\n", port);
    fflush(stdout);
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                usleep(50000);
            continue;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(lfd);
            signal(SIGTERM, SIG_DFL);
            signal(SIGINT, SIG_DFL);
            /* Die with the server, whoever signals it. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != me) _exit(0);
            serve(fd);
            _exit(0);
        }
        if (pid < 0) usleep(50000);
        close(fd);
    }
}
