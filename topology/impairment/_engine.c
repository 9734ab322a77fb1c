/* The impairment engine's per-packet work in C (topology/impairment/engine.py, --core native).
 *
 * Python keeps the engine's control: the JSON protocol, binding each NFQUEUE inside its
 * namespace, signals, shutdown. This file keeps what every queued packet costs: reading the
 * queues' netlink messages in batches (recvmmsg), deciding each packet's fate with the same
 * model and the same random stream as topology/impairment/direction.py, holding its id in a
 * heap until its release time, and writing verdicts, several per send. The decisions are
 * bit for bit those of the Python ``Direction`` for the same ``random.Random`` state: the
 * generator is MT19937 continued from ``Random.getstate()``, ``random()`` is its 53-bit
 * double, ``gauss`` is CPython's (a cached second value included), and the arithmetic is
 * written in the same order (tests/test_impairment_core.py replays arrivals through both).
 *
 * Bad netlink input (short, truncated or malformed messages) is counted and skipped, never
 * read beyond what arrived.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <time.h>

#define MT_N 624
#define MT_M 397
#define RECV_BATCH 64          /* messages per recvmmsg */
#define RECV_BURST 256         /* packets read from one queue before releasing what is due */
#define RX_SLOT 1024           /* a packet message with a 64-byte copy is about 200 bytes */
#define VERDICT_LEN 32         /* nlmsghdr 16 + nfgenmsg 4 + nlattr 4 + verdict 8 */
#define SEND_CHUNK 256         /* verdicts per send, as the Python engine */
#define MAX_LAGGED 100000
#define MAX_FDS 1024
#define READY_BATCH 64         /* ready queues taken from epoll at a time */

#define NLMSG_ERROR_TYPE 0x2
#define NFQNL_MSG_PACKET ((3 << 8) | 0)
#define NFQNL_MSG_VERDICT ((3 << 8) | 1)
#define NFQA_PACKET_HDR 1
#define NFQA_VERDICT_HDR 2
#define NFQA_PAYLOAD 10
#define NFQA_CAP_LEN 13
#define NLA_TYPE_MASK 0x3FFF
#define NF_DROP 0
#define NF_ACCEPT 1

enum { LOSS_NONE, LOSS_BERNOULLI, LOSS_GE };

/* One direction's model, as direction.Direction computes it from an Impairment. */
typedef struct {
    double delay, jitter, sec_per_byte;
    int uniform, fifo, loss;
    double bernoulli, ge_p, ge_r, ge_bad, ge_good;
} Params;

typedef struct {
    uint32_t mt[MT_N];
    int index;
    int has_gauss;
    double gauss_next;
} Rng;

typedef struct {
    int fd;
    uint16_t queue;
    Params p;
    Rng rng;
    double last;               /* the previous release of a FIFO direction */
    int bad;                   /* Gilbert-Elliott state */
    int fault;                 /* losses count as dropped_fault */
    uint64_t seen, dropped, dropped_fault, released;
    uint8_t *out;              /* verdicts waiting to be sent */
    size_t out_n, out_cap;     /* in verdicts */
    uint8_t prefix[24];        /* a verdict but its 8-byte body */
} Queue;

typedef struct {
    double due;
    uint32_t queue, id;
} Held;

typedef struct {
    PyObject_HEAD
    Queue *queues;
    int nq, capq;
    Held *heap;
    size_t nheap, capheap;
    uint64_t *hist;            /* 1-us buckets of release lateness, the last one open-ended */
    int buckets;
    double late_max;
    double lagged_s, lagged_share, lagged_stall_s, unix_offset, spin;
    double tick;               /* busy mode's period (0: never busy) */
    int busy;                  /* reading and releasing on the tick, not on every event */
    double tick_at, last_read; /* the last tick; the last wake-up that read packets */
    double early_max;          /* the earliest release before its due time (busy mode) */
    uint64_t ticks;
    long second;               /* wall-clock second in progress, -1 before the first */
    uint64_t second_n, second_late;
    double second_max;
    long *lagged_second;       /* closed seconds that lagged, and their worst lateness */
    double *lagged_worst;
    int nlagged;
    uint64_t verdict_errors, malformed, truncated, send_errors;
    int epfd;                  /* every queue's socket: a wake-up costs the same for 1 or 200 */
    struct epoll_event ready[READY_BATCH];
    uint8_t *rx;               /* RECV_BATCH slots of RX_SLOT bytes */
    struct mmsghdr msgs[RECV_BATCH];
    struct iovec iovs[RECV_BATCH];
} Core;

/* ------------------------------------------------------------------ the random stream */

static uint32_t mt_next(Rng *r) {
    static const uint32_t mag[2] = {0x0u, 0x9908b0dfu};
    uint32_t y;
    if (r->index >= MT_N) {
        int k;
        for (k = 0; k < MT_N - MT_M; k++) {
            y = (r->mt[k] & 0x80000000u) | (r->mt[k + 1] & 0x7fffffffu);
            r->mt[k] = r->mt[k + MT_M] ^ (y >> 1) ^ mag[y & 1u];
        }
        for (; k < MT_N - 1; k++) {
            y = (r->mt[k] & 0x80000000u) | (r->mt[k + 1] & 0x7fffffffu);
            r->mt[k] = r->mt[k + (MT_M - MT_N)] ^ (y >> 1) ^ mag[y & 1u];
        }
        y = (r->mt[MT_N - 1] & 0x80000000u) | (r->mt[0] & 0x7fffffffu);
        r->mt[MT_N - 1] = r->mt[MT_M - 1] ^ (y >> 1) ^ mag[y & 1u];
        r->index = 0;
    }
    y = r->mt[r->index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* random.random(): a double in [0, 1) from 53 random bits. */
static double rng_random(Rng *r) {
    uint32_t a = mt_next(r) >> 5, b = mt_next(r) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

/* random.gauss(mu, sigma), CPython 3.11's: two values per pair of draws, the second kept. */
static double rng_gauss(Rng *r, double mu, double sigma) {
    double z;
    if (r->has_gauss) {
        z = r->gauss_next;
        r->has_gauss = 0;
    } else {
        double x2pi = rng_random(r) * (2.0 * M_PI);
        double g2rad = sqrt(-2.0 * log(1.0 - rng_random(r)));
        z = cos(x2pi) * g2rad;
        r->gauss_next = sin(x2pi) * g2rad;
        r->has_gauss = 1;
    }
    return mu + z * sigma;
}

/* Random.getstate() -> (3, (624 words..., index), gauss_next) into ``r``. */
static int rng_from_state(Rng *r, PyObject *state) {
    PyObject *words, *gauss;
    int version;
    if (!PyArg_ParseTuple(state, "iO!O", &version, &PyTuple_Type, &words, &gauss))
        return -1;
    if (version != 3 || PyTuple_GET_SIZE(words) != MT_N + 1) {
        PyErr_SetString(PyExc_ValueError, "not a random.Random state (version 3, 625 words)");
        return -1;
    }
    for (int i = 0; i <= MT_N; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(words, i));
        if (PyErr_Occurred()) return -1;
        if (i < MT_N) r->mt[i] = (uint32_t)v;
        else if (v > MT_N) {
            PyErr_SetString(PyExc_ValueError, "random state index out of range");
            return -1;
        } else r->index = (int)v;
    }
    if (gauss == Py_None) {
        r->has_gauss = 0;
    } else {
        r->gauss_next = PyFloat_AsDouble(gauss);
        if (PyErr_Occurred()) return -1;
        r->has_gauss = 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ decisions */

static int params_from(Params *p, PyObject *t) {
    /* (delay_s, jitter_s, uniform, fifo, sec_per_byte, loss_kind, bernoulli, p, r, bad, good) */
    if (!PyArg_ParseTuple(t, "ddppdiddddd", &p->delay, &p->jitter, &p->uniform, &p->fifo,
                          &p->sec_per_byte, &p->loss, &p->bernoulli, &p->ge_p, &p->ge_r,
                          &p->ge_bad, &p->ge_good))
        return -1;
    if (p->loss < LOSS_NONE || p->loss > LOSS_GE || p->delay < 0 || p->jitter < 0 ||
        p->sec_per_byte < 0) {
        PyErr_SetString(PyExc_ValueError, "bad direction parameters");
        return -1;
    }
    return 0;
}

static int lost(Queue *q) {
    Rng *r = &q->rng;
    if (q->p.loss == LOSS_BERNOULLI) return rng_random(r) < q->p.bernoulli;
    if (q->p.loss == LOSS_GE) {
        if (q->bad) {
            if (rng_random(r) < q->p.ge_r) q->bad = 0;
        } else if (rng_random(r) < q->p.ge_p) {
            q->bad = 1;
        }
        return rng_random(r) < (q->bad ? q->p.ge_bad : q->p.ge_good);
    }
    return 0;
}

static double draw_delay(Queue *q) {
    if (!q->p.jitter) return q->p.delay;
    double d;
    if (q->p.uniform)
        d = q->p.delay + (2 * rng_random(&q->rng) - 1) * sqrt(3.0) * q->p.jitter;
    else
        d = rng_gauss(&q->rng, q->p.delay, q->p.jitter);
    return d > 0 ? d : 0.0;
}

/* The release time of a packet arriving at ``now`` with ``length`` bytes; NAN when lost. */
static double decide(Queue *q, double now, uint32_t length) {
    if (lost(q)) return NAN;
    double release = now + draw_delay(q);
    if (q->p.fifo) {
        if (release < q->last) release = q->last;
        release += length * q->p.sec_per_byte;
        q->last = release;
    }
    return release;
}

/* ------------------------------------------------------------------ the heap */

static int held_before(const Held *a, const Held *b) {
    if (a->due != b->due) return a->due < b->due;
    if (a->queue != b->queue) return a->queue < b->queue;
    return a->id < b->id;
}

static int heap_push(Core *c, double due, uint32_t queue, uint32_t id) {
    if (c->nheap == c->capheap) {
        size_t cap = c->capheap ? c->capheap * 2 : 4096;
        Held *h = PyMem_RawRealloc(c->heap, cap * sizeof(Held));
        if (!h) return -1;
        c->heap = h;
        c->capheap = cap;
    }
    size_t i = c->nheap++;
    Held x = {due, queue, id};
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!held_before(&x, &c->heap[parent])) break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = x;
    return 0;
}

static Held heap_pop(Core *c) {
    Held top = c->heap[0], x = c->heap[--c->nheap];
    size_t i = 0, n = c->nheap;
    while (1) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && held_before(&c->heap[child + 1], &c->heap[child])) child++;
        if (!held_before(&c->heap[child], &x)) break;
        c->heap[i] = c->heap[child];
        i = child;
    }
    if (n) c->heap[i] = x;
    return top;
}

/* ------------------------------------------------------------------ verdicts */

static void flush(Core *c, Queue *q) {
    for (size_t i = 0; i < q->out_n; i += SEND_CHUNK) {
        size_t n = q->out_n - i < SEND_CHUNK ? q->out_n - i : SEND_CHUNK;
        if (send(q->fd, q->out + i * VERDICT_LEN, n * VERDICT_LEN, 0) < 0) c->send_errors++;
    }
    q->out_n = 0;
}

static int verdict(Core *c, Queue *q, uint32_t code, uint32_t id) {
    if (q->out_n == q->out_cap) {
        if (q->out_n >= SEND_CHUNK) {
            flush(c, q);
        } else {
            size_t cap = q->out_cap ? q->out_cap * 2 : 64;
            uint8_t *o = PyMem_RawRealloc(q->out, cap * VERDICT_LEN);
            if (!o) return -1;
            q->out = o;
            q->out_cap = cap;
        }
    }
    uint8_t *v = q->out + q->out_n++ * VERDICT_LEN;
    memcpy(v, q->prefix, sizeof q->prefix);
    uint32_t be = htonl(code);
    memcpy(v + 24, &be, 4);
    be = htonl(id);
    memcpy(v + 28, &be, 4);
    return 0;
}

static void make_prefix(uint8_t *p, uint16_t queue) {
    uint32_t len = VERDICT_LEN, zero = 0;
    uint16_t type = NFQNL_MSG_VERDICT, flags = 1 /* NLM_F_REQUEST */, res = htons(queue);
    uint16_t alen = 4 + 8, atype = NFQA_VERDICT_HDR;
    memcpy(p, &len, 4);
    memcpy(p + 4, &type, 2);
    memcpy(p + 6, &flags, 2);
    memcpy(p + 8, &zero, 4);     /* seq */
    memcpy(p + 12, &zero, 4);    /* port id */
    p[16] = 0;                   /* AF_UNSPEC */
    p[17] = 0;                   /* version */
    memcpy(p + 18, &res, 2);
    memcpy(p + 20, &alen, 2);
    memcpy(p + 22, &atype, 2);
}

/* ------------------------------------------------------------------ packets */

static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One NFQNL_MSG_PACKET message: its packet id and original length; -1 when malformed.
 * ``cut``: the message's tail was lost to a short read; what arrived of it still counts
 * (the packet id comes first, and a packet without a verdict would be held forever). */
static int parse_packet(const uint8_t *m, uint32_t length, int cut, uint32_t *id,
                        uint32_t *plen) {
    uint32_t pos = 20, payload = 0, cap = 0;
    int have_id = 0;
    while (pos + 4 <= length) {
        uint16_t alen, akind;
        memcpy(&alen, m + pos, 2);
        memcpy(&akind, m + pos + 2, 2);
        if (alen < 4 || pos + alen > length) {
            if (cut) break;
            return -1;
        }
        akind &= NLA_TYPE_MASK;
        if (akind == NFQA_PACKET_HDR && alen >= 8) {
            uint32_t be;
            memcpy(&be, m + pos + 4, 4);
            *id = ntohl(be);
            have_id = 1;
        } else if (akind == NFQA_PAYLOAD) {
            payload = alen - 4u;
        } else if (akind == NFQA_CAP_LEN && alen >= 8) {
            uint32_t be;
            memcpy(&be, m + pos + 4, 4);
            cap = ntohl(be);
        }
        pos += (alen + 3u) & ~3u;
    }
    if (!have_id) return -1;
    *plen = cap ? cap : payload;
    return 0;
}

/* Every netlink message of one received buffer (``cut``: the read was short). */
static int on_buffer(Core *c, int index, const uint8_t *buf, size_t n, int cut, double now) {
    Queue *q = &c->queues[index];
    size_t off = 0;
    while (off + 16 <= n) {
        uint32_t length;
        uint16_t kind;
        int last_cut = 0;
        memcpy(&length, buf + off, 4);
        memcpy(&kind, buf + off + 4, 2);
        if (length < 16 || (length > n - off && !cut)) {
            c->malformed++;
            break;
        }
        if (length > n - off) {    /* the message the short read cut: the last one */
            length = (uint32_t)(n - off);
            last_cut = 1;
        }
        if (kind == NFQNL_MSG_PACKET) {
            uint32_t id = 0, plen = 0;
            if (parse_packet(buf + off, length, last_cut, &id, &plen) < 0) {
                c->malformed++;    /* no id: nothing to give a verdict to */
            } else {
                q->seen++;
                double due = decide(q, now, plen);
                if (isnan(due)) {
                    if (q->fault) q->dropped_fault++;
                    else q->dropped++;
                    if (verdict(c, q, NF_DROP, id) < 0) return -1;
                } else if (heap_push(c, due, (uint32_t)index, id) < 0) {
                    return -1;
                }
            }
        } else if (kind == NLMSG_ERROR_TYPE) {
            int32_t err = 0;
            if (length >= 20) memcpy(&err, buf + off + 16, 4);
            if (err) c->verdict_errors++;
        }
        if (last_cut) break;
        off += (length + 3u) & ~3u;
    }
    return 0;
}

/* Read queue ``index`` (up to RECV_BURST packets); each packet arrived at ``arrival``, or, when
 * it is negative, when its batch was read. Returns the packets read, -1 out of memory. */
static int on_readable(Core *c, int index, double arrival) {
    Queue *q = &c->queues[index];
    int got = 0;
    while (got < RECV_BURST) {
        int want = RECV_BURST - got < RECV_BATCH ? RECV_BURST - got : RECV_BATCH;
        int n = recvmmsg(q->fd, c->msgs, (unsigned)want, MSG_DONTWAIT, NULL);
        if (n <= 0) break;
        double now = arrival < 0 ? monotonic() : arrival;
        for (int i = 0; i < n; i++) {
            if (c->msgs[i].msg_hdr.msg_flags & MSG_TRUNC) c->truncated++;  /* its tail is lost */
            size_t len = c->msgs[i].msg_len < RX_SLOT ? c->msgs[i].msg_len : RX_SLOT;
            int cut = (c->msgs[i].msg_hdr.msg_flags & MSG_TRUNC) != 0;
            if (on_buffer(c, index, c->rx + (size_t)i * RX_SLOT, len, cut, now) < 0) return -1;
        }
        got += n;
        if (n < want) break;
    }
    if (q->out_n) flush(c, q);
    return got;
}

static void close_second(Core *c) {
    if (c->second < 0 || !c->second_n || c->nlagged >= MAX_LAGGED) return;
    if (c->second_max >= c->lagged_stall_s ||
        (double)c->second_late / (double)c->second_n >= c->lagged_share) {
        c->lagged_second[c->nlagged] = c->second;
        c->lagged_worst[c->nlagged] = c->second_max;
        c->nlagged++;
    }
}

/* Release every held packet due by ``horizon``; ``now`` is the time it happens (a release
 * before its due time, as busy mode makes, counts as on time and in ``early_max``). */
static int release_due(Core *c, double horizon, double now) {
    uint64_t touched[(MAX_FDS + 63) / 64] = {0};
    while (c->nheap && c->heap[0].due <= horizon) {
        Held h = heap_pop(c);
        Queue *q = &c->queues[h.queue];
        if (verdict(c, q, NF_ACCEPT, h.id) < 0) return -1;
        q->released++;
        touched[h.queue / 64] |= 1ull << (h.queue % 64);
        double late = now - h.due;
        if (late < 0) {
            if (-late > c->early_max) c->early_max = -late;
            late = 0;
        }
        if (late > c->late_max) c->late_max = late;
        long second = (long)(now + c->unix_offset);
        if (second != c->second) {
            close_second(c);
            c->second = second;
            c->second_n = c->second_late = 0;
            c->second_max = 0.0;
        }
        c->second_n++;
        c->second_late += late >= c->lagged_s;
        if (late > c->second_max) c->second_max = late;
        long us = (long)(late * 1e6);
        c->hist[us < c->buckets ? us : c->buckets]++;
    }
    for (int i = 0; i < c->nq; i++)
        if (touched[i / 64] >> (i % 64) & 1) flush(c, &c->queues[i]);
    return 0;
}

/* ------------------------------------------------------------------ the type */

static int Core_init(Core *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"buckets", "lagged_s", "lagged_share", "lagged_stall_s",
                            "unix_offset", "spin_s", "tick_s", NULL};
    int buckets = 20000;
    double lagged_s = 0.002, share = 0.10, stall = 0.100, offset = 0.0, spin = 0.0, tick = 0.0;
    if (c->hist) {
        PyErr_SetString(PyExc_RuntimeError, "a Core is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|idddddd", names, &buckets, &lagged_s, &share,
                                     &stall, &offset, &spin, &tick))
        return -1;
    if (buckets < 1 || buckets > 10000000 || spin < 0 || tick < 0 || tick > 0.01) {
        PyErr_SetString(PyExc_ValueError, "buckets 1..10000000, spin_s >= 0, tick_s 0..0.01");
        return -1;
    }
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (c->epfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    c->hist = PyMem_RawCalloc((size_t)buckets + 1, sizeof(uint64_t));
    c->rx = PyMem_RawMalloc((size_t)RECV_BATCH * RX_SLOT);
    c->lagged_second = PyMem_RawMalloc(MAX_LAGGED * sizeof(long));
    c->lagged_worst = PyMem_RawMalloc(MAX_LAGGED * sizeof(double));
    if (!c->hist || !c->rx || !c->lagged_second || !c->lagged_worst) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < RECV_BATCH; i++) {
        c->iovs[i].iov_base = c->rx + (size_t)i * RX_SLOT;
        c->iovs[i].iov_len = RX_SLOT;
        memset(&c->msgs[i].msg_hdr, 0, sizeof c->msgs[i].msg_hdr);
        c->msgs[i].msg_hdr.msg_iov = &c->iovs[i];
        c->msgs[i].msg_hdr.msg_iovlen = 1;
    }
    c->buckets = buckets;
    c->lagged_s = lagged_s;
    c->lagged_share = share;
    c->lagged_stall_s = stall;
    c->unix_offset = offset;
    c->spin = spin;
    c->tick = tick;
    c->second = -1;
    return 0;
}

static void Core_dealloc(Core *c) {
    if (c->hist || c->epfd > 0) close(c->epfd);  /* tp_alloc zeroed it; init set it */
    for (int i = 0; i < c->nq; i++) PyMem_RawFree(c->queues[i].out);
    PyMem_RawFree(c->queues);
    PyMem_RawFree(c->heap);
    PyMem_RawFree(c->hist);
    PyMem_RawFree(c->rx);
    PyMem_RawFree(c->lagged_second);
    PyMem_RawFree(c->lagged_worst);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int ready(Core *c) {
    if (!c->hist) {
        PyErr_SetString(PyExc_RuntimeError, "the Core is not initialised");
        return 0;
    }
    return 1;
}

static Queue *queue_at(Core *c, int index) {
    if (index < 0 || index >= c->nq) {
        PyErr_SetString(PyExc_IndexError, "no such queue");
        return NULL;
    }
    return &c->queues[index];
}

static PyObject *Core_add(Core *c, PyObject *args) {
    int fd, queue;
    PyObject *params, *state;
    if (!ready(c) || !PyArg_ParseTuple(args, "iiO!O!", &fd, &queue, &PyTuple_Type, &params,
                                       &PyTuple_Type, &state))
        return NULL;
    if (c->nq >= MAX_FDS - 8 || queue < 0 || queue > 65535) {
        PyErr_SetString(PyExc_ValueError, "too many queues, or a queue number beyond 65535");
        return NULL;
    }
    Queue q;
    memset(&q, 0, sizeof q);
    if (params_from(&q.p, params) < 0 || rng_from_state(&q.rng, state) < 0) return NULL;
    q.fd = fd;
    q.queue = (uint16_t)queue;
    make_prefix(q.prefix, q.queue);
    if (c->nq == c->capq) {
        int cap = c->capq ? c->capq * 2 : 16;
        Queue *qs = PyMem_RawRealloc(c->queues, (size_t)cap * sizeof(Queue));
        if (!qs) return PyErr_NoMemory();
        c->queues = qs;
        c->capq = cap;
    }
    if (fd >= 0) {  /* -1: a queue only ``feed`` fills (tests, the fuzzer); last, so a
                     * failure before it leaves nothing registered under this index */
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)c->nq};
        if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    }
    c->queues[c->nq] = q;
    return PyLong_FromLong(c->nq++);
}

static PyObject *Core_set(Core *c, PyObject *args) {
    int index, fault;
    PyObject *params;
    if (!ready(c) || !PyArg_ParseTuple(args, "iO!p", &index, &PyTuple_Type, &params, &fault))
        return NULL;
    Queue *q = queue_at(c, index);
    Params p;
    if (!q || params_from(&p, params) < 0) return NULL;
    q->p = p;                  /* the random stream, loss state and last release go on */
    q->fault = fault;
    Py_RETURN_NONE;
}

static PyObject *Core_decide(Core *c, PyObject *args) {
    int index;
    double now;
    unsigned int length = 0;
    if (!ready(c) || !PyArg_ParseTuple(args, "id|I", &index, &now, &length)) return NULL;
    Queue *q = queue_at(c, index);
    if (!q) return NULL;
    double due = decide(q, now, length);
    if (isnan(due)) Py_RETURN_NONE;
    return PyFloat_FromDouble(due);
}

static PyObject *Core_feed(Core *c, PyObject *args) {
    /* feed(index, buffer, now, cut=False): one received buffer, as if read from the queue's
     * socket (tests and the fuzzer; ``cut``: as a short read); verdicts go to the queue's fd. */
    int index, cut = 0;
    Py_buffer b;
    double now;
    if (!ready(c) || !PyArg_ParseTuple(args, "iy*d|p", &index, &b, &now, &cut)) return NULL;
    Queue *q = queue_at(c, index);
    int rc = q ? on_buffer(c, index, b.buf, (size_t)b.len, cut, now) : -1;
    PyBuffer_Release(&b);
    if (!q) return NULL;
    if (rc < 0) return PyErr_NoMemory();
    if (q->out_n) flush(c, q);
    Py_RETURN_NONE;
}

static PyObject *Core_release(Core *c, PyObject *args) {
    double now;
    if (!ready(c) || !PyArg_ParseTuple(args, "d", &now)) return NULL;
    if (release_due(c, now, now) < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* The fds among pfd[0..nf) that poll found readable, as a list (NULL with an error set). */
static PyObject *readable(struct pollfd *pfd, Py_ssize_t nf) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < nf; i++) {
        if (!pfd[i].revents) continue;
        PyObject *fd = PyLong_FromLong(pfd[i].fd);
        if (!fd || PyList_Append(out, fd) < 0) {
            Py_XDECREF(fd);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(fd);
    }
    return out;
}

/* One tick of busy mode. Under a steady stream every arrival and every release was a wake-up
 * of its own (10-20 us each on the 2-core VM, most of a packet's cost); on the tick one
 * wake-up reads what arrived and releases what is due. A packet read at tick t arrived during
 * the tick before it: it is taken to have arrived at t - tick/2, and what is due by
 * t + tick/2 is released at t, so both errors lie within +-tick/2 and average zero. A tick
 * that reads nothing, with nothing due within 4 ticks, ends busy mode. */
/* Read every queue epoll finds readable now; the packets read (-1 on no memory). Before
 * epoll every wake-up polled, and every tick read, each queue: with 200 queues (REGION=all)
 * that was 200 syscalls a tick, 37% of a core at 2,300 packets/s. */
static int read_ready(Core *c, double arrival) {
    int got = 0, n, rounds = c->nq / READY_BATCH + 1;  /* each ready queue once, or so */
    do {
        n = epoll_wait(c->epfd, c->ready, READY_BATCH, 0);
        for (int i = 0; i < n; i++) {
            int r = on_readable(c, (int)c->ready[i].data.u32, arrival);
            if (r < 0) return -1;
            got += r;
        }
    } while (n == READY_BATCH && --rounds > 0);
    return got;
}

static int busy_tick(Core *c, double now) {
    c->tick_at = now;
    c->ticks++;
    int got = read_ready(c, now - c->tick / 2);
    if (got < 0) return -1;
    if (release_due(c, now + c->tick / 2, now) < 0) return -1;
    if (!got && (!c->nheap || c->heap[0].due > now + 4 * c->tick)) c->busy = 0;
    return 0;
}

/* run(fds, idle_s) -> the fds of ``fds`` that are readable. Until one is, it reads the
 * queues, decides, holds and releases: on every event, sleeping to the next release (the
 * last ``spin_s`` of it awake), or, with ``tick_s`` and packets arriving within a tick of
 * each other, in busy mode (busy_tick). */
static PyObject *Core_run(Core *c, PyObject *args) {
    PyObject *fds;
    double idle;
    if (!ready(c) || !PyArg_ParseTuple(args, "O!d", &PyTuple_Type, &fds, &idle)) return NULL;
    Py_ssize_t nf = PyTuple_GET_SIZE(fds);
    if (nf > 8 || idle <= 0) {
        PyErr_SetString(PyExc_ValueError, "at most 8 fds, and a positive idle time");
        return NULL;
    }
    struct pollfd pfd[1 + 8];
    int nq = 1;  /* pfd[0]: the queues' epoll */
    pfd[0] = (struct pollfd){c->epfd, POLLIN, 0};
    for (Py_ssize_t i = 0; i < nf; i++) {
        int fd = PyLong_AsLong(PyTuple_GET_ITEM(fds, i));
        if (PyErr_Occurred()) return NULL;
        pfd[nq + i] = (struct pollfd){fd, POLLIN, 0};
    }
    while (1) {
        if (c->busy) {  /* only the caller's fds are watched between ticks */
            double now = monotonic(), next = c->tick_at + c->tick;
            if (next < now) next = now;  /* a missed tick is not made up */
            double wait = next - now;
            struct timespec ts = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
            int n;
            Py_BEGIN_ALLOW_THREADS
            n = ppoll(pfd + nq, (nfds_t)nf, &ts, NULL);
            Py_END_ALLOW_THREADS
            if (n < 0 && errno != EINTR) return PyErr_SetFromErrno(PyExc_OSError);
            if (n < 0 && PyErr_CheckSignals() < 0) return NULL;
            now = monotonic();
            if (now >= next && busy_tick(c, now) < 0) return PyErr_NoMemory();
            if (n > 0) return readable(pfd + nq, nf);
            continue;
        }
        double timeout = idle;
        if (c->nheap) {
            double now = monotonic(), due = c->heap[0].due;
            if (due - now <= c->spin) {
                while (now < due) now = monotonic();   /* waking from idle costs tens of us */
                if (release_due(c, now, now) < 0) return PyErr_NoMemory();
            }
            if (c->nheap) {
                timeout = c->heap[0].due - monotonic() - c->spin;
                if (timeout < 0) timeout = 0;
                if (timeout > idle) timeout = idle;
            }
        }
        struct timespec ts = {(time_t)timeout, (long)((timeout - (time_t)timeout) * 1e9)};
        int n;
        Py_BEGIN_ALLOW_THREADS
        n = ppoll(pfd, (nfds_t)(nq + nf), &ts, NULL);
        Py_END_ALLOW_THREADS
        if (n < 0) {
            if (errno == EINTR) {
                if (PyErr_CheckSignals() < 0) return NULL;
                continue;
            }
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        if (n == 0) continue;
        int got = 0;
        if (pfd[0].revents && (got = read_ready(c, -1.0)) < 0) return PyErr_NoMemory();
        if (got && c->tick > 0) {
            double now = monotonic();
            if (now - c->last_read < c->tick) {
                c->busy = 1;
                c->tick_at = now;
            }
            c->last_read = now;
        }
        for (Py_ssize_t i = 0; i < nf; i++)
            if (pfd[nq + i].revents) return readable(pfd + nq, nf);
    }
}

/* shutdown(): accept every held packet now (stopping must not lose packets). */
static PyObject *Core_shutdown(Core *c, PyObject *unused) {
    if (!ready(c)) return NULL;
    while (c->nheap) {
        Held h = heap_pop(c);
        if (verdict(c, &c->queues[h.queue], NF_ACCEPT, h.id) < 0) return PyErr_NoMemory();
    }
    for (int i = 0; i < c->nq; i++) flush(c, &c->queues[i]);
    Py_RETURN_NONE;
}

static int set_u64(PyObject *d, const char *k, uint64_t v) {
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    int rc = o ? PyDict_SetItemString(d, k, o) : -1;
    Py_XDECREF(o);
    return rc;
}

static int set_f(PyObject *d, const char *k, double v) {
    PyObject *o = PyFloat_FromDouble(v);
    int rc = o ? PyDict_SetItemString(d, k, o) : -1;
    Py_XDECREF(o);
    return rc;
}

/* stats() -> {"queues": [(seen, dropped_loss, dropped_fault, delayed, fault)], "hist":
 * {us: n}, "late_max_s", "lagged": {second: worst_s} (the second in progress included when
 * it lags), "held", "verdict_errors", "malformed", "truncated", "send_errors"}. */
static PyObject *Core_stats(Core *c, PyObject *unused) {
    if (!ready(c)) return NULL;
    PyObject *d = PyDict_New(), *qs = PyList_New(c->nq), *hist = PyDict_New(),
             *lagged = PyDict_New();
    if (!d || !qs || !hist || !lagged) goto fail;
    for (int i = 0; i < c->nq; i++) {
        Queue *q = &c->queues[i];
        PyObject *t = Py_BuildValue("(KKKKO)", (unsigned long long)q->seen,
                                    (unsigned long long)q->dropped,
                                    (unsigned long long)q->dropped_fault,
                                    (unsigned long long)q->released,
                                    q->fault ? Py_True : Py_False);
        if (!t) goto fail;
        PyList_SET_ITEM(qs, i, t);
    }
    for (int us = 0; us <= c->buckets; us++) {
        if (!c->hist[us]) continue;
        PyObject *k = PyLong_FromLong(us), *v = PyLong_FromUnsignedLongLong(c->hist[us]);
        int rc = k && v ? PyDict_SetItem(hist, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0) goto fail;
    }
    for (int i = 0; i <= c->nlagged; i++) {
        long second;
        double worst;
        if (i < c->nlagged) {
            second = c->lagged_second[i];
            worst = c->lagged_worst[i];
        } else {               /* the second in progress, if it lags so far */
            if (c->second < 0 || !c->second_n) break;
            if (!(c->second_max >= c->lagged_stall_s ||
                  (double)c->second_late / (double)c->second_n >= c->lagged_share))
                break;
            second = c->second;
            worst = c->second_max;
        }
        PyObject *k = PyLong_FromLong(second), *v = PyFloat_FromDouble(worst);
        int rc = k && v ? PyDict_SetItem(lagged, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0) goto fail;
    }
    if (PyDict_SetItemString(d, "queues", qs) < 0 || PyDict_SetItemString(d, "hist", hist) < 0 ||
        PyDict_SetItemString(d, "lagged", lagged) < 0 ||
        set_f(d, "late_max_s", c->late_max) < 0 || set_f(d, "early_max_s", c->early_max) < 0 ||
        set_u64(d, "ticks", c->ticks) < 0 || set_u64(d, "busy", (uint64_t)c->busy) < 0 || set_u64(d, "held", c->nheap) < 0 ||
        set_u64(d, "verdict_errors", c->verdict_errors) < 0 ||
        set_u64(d, "malformed", c->malformed) < 0 ||
        set_u64(d, "truncated", c->truncated) < 0 ||
        set_u64(d, "send_errors", c->send_errors) < 0)
        goto fail;
    Py_DECREF(qs);
    Py_DECREF(hist);
    Py_DECREF(lagged);
    return d;
fail:
    Py_XDECREF(d);
    Py_XDECREF(qs);
    Py_XDECREF(hist);
    Py_XDECREF(lagged);
    return NULL;
}

static PyMethodDef Core_methods[] = {
    {"add", (PyCFunction)Core_add, METH_VARARGS,
     "add(fd, queue, params, random_state) -> index (params: direction.Direction.params())"},
    {"set", (PyCFunction)Core_set, METH_VARARGS,
     "set(index, params, fault): a new model from the next packet on, the stream going on"},
    {"decide", (PyCFunction)Core_decide, METH_VARARGS,
     "decide(index, now, length=0) -> release time, or None when lost (as Direction.decide)"},
    {"feed", (PyCFunction)Core_feed, METH_VARARGS,
     "feed(index, buffer, now): netlink messages as if read from queue ``index``"},
    {"release", (PyCFunction)Core_release, METH_VARARGS,
     "release(now): give the verdicts of what is due by ``now``"},
    {"run", (PyCFunction)Core_run, METH_VARARGS,
     "run(fds, idle_s) -> the readable ones of ``fds``; impairs until one is"},
    {"shutdown", (PyCFunction)Core_shutdown, METH_NOARGS, "shutdown(): accept all held"},
    {"stats", (PyCFunction)Core_stats, METH_NOARGS, "stats() -> dict"},
    {NULL}
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "topology.impairment._engine.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The impairment engine's queues, heap and verdicts (see the module's source).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_engine", "The impairment engine's native core.", -1, NULL,
};

PyMODINIT_FUNC PyInit__engine(void) {
    if (PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "MAX_QUEUES", MAX_FDS - 8);
    return m;
}
