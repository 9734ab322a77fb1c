/* The relay's fast path: datagrams of known IPv4 flows, forwarded without Python per datagram.
 *
 * Python owns everything (buffers, the flow table, the decisions); this file only moves bytes
 * for flows Python has already created, and hands every other datagram back to Python as a
 * "miss" (first packets, IPv6, bad headers, truncation, unknown or spoofed return traffic).
 *
 * A flow record is 18 little-endian uint64 words that Python allocates and C updates in place
 * (layout: REC_* below, mirrored in flows.py). The fast table is a dict {key: record address}
 * where key = the 48 bits of (port, IPv4 address) as laid out in bytes 2..7 of a sockaddr_in or
 * of a hop header, read little-endian (see hop.py and flows.sockaddr_key).
 *
 * Also exports plain recvmmsg/sendmmsg (count or -errno) for Python-side batches.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>

enum {
    REC_NEXT_NAME, REC_NEXT_NAMELEN, REC_HEADER, REC_HEADER_LEN, REC_CLIENT_NAME,
    REC_CLIENT_NAMELEN, REC_PREV_NAME, REC_PREV_NAMELEN, REC_NEXT_KEY, REC_UP_PACKETS,
    REC_UP_BYTES, REC_DOWN_PACKETS, REC_DOWN_BYTES, REC_LAST_SEEN_NS, REC_UFRAG_LEN,
    REC_UFRAG, REC_WORDS = REC_UFRAG + 3  /* the server ufrag the flow was routed by: 24 bytes */
};
#define UFRAG_MAX 24

#define HOP_MAGIC 0x0E
#define HOP_V4_TO_SERVER 0x00
#define HOP_V4_TO_CLIENT 0x01
#define HOP_V4_LEN 8

static inline uint64_t key48(const uint8_t *p) {
    return (uint64_t)p[2] | (uint64_t)p[3] << 8 | (uint64_t)p[4] << 16 | (uint64_t)p[5] << 24 |
           (uint64_t)p[6] << 32 | (uint64_t)p[7] << 40;
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Look a key up in the fast table; NULL when absent. Never raises. */
static inline uint64_t *lookup(PyObject *table, uint64_t key) {
    PyObject *k = PyLong_FromUnsignedLongLong(key);
    if (!k) { PyErr_Clear(); return NULL; }
    PyObject *v = PyDict_GetItemWithError(table, k);
    Py_DECREF(k);
    if (!v) { PyErr_Clear(); return NULL; }
    return (uint64_t *)PyLong_AsVoidPtr(v);
}

/* Whether a client's datagram may take the fast path on its flow: anything but a STUN
 * Binding request (RFC 8489: type 0x0001, the magic cookie) that asks for another server ufrag
 * than the one the flow was routed by. A NAT may give a flow's address to another caller,
 * whose session may be behind another next hop: Python routes such a check again. The flow's
 * own consent checks name its ufrag and stay here; so does any datagram Python would not
 * route either (a Binding request without a well-framed USERNAME: services/wire/stun.py's
 * read_username, whose rules this follows). */
static int own_datagram(const uint64_t *rec, const uint8_t *d, size_t len) {
    if (len < 20 || d[0] != 0x00 || d[1] != 0x01 || d[4] != 0x21 || d[5] != 0x12 ||
        d[6] != 0xA4 || d[7] != 0x42)
        return 1;
    size_t end = 20 + ((size_t)d[2] << 8 | d[3]);
    if (end % 4 || end > len) return 1;  /* not well framed: Python would not route it */
    size_t pos = 20;
    while (pos + 4 <= end) {
        size_t type = (size_t)d[pos] << 8 | d[pos + 1], alen = (size_t)d[pos + 2] << 8 | d[pos + 3];
        size_t value = pos + 4;
        if (value + alen > end) return 1;
        if (type == 0x0006) {
            const uint8_t *colon = memchr(d + value, ':', alen);
            size_t ulen = colon ? (size_t)(colon - (d + value)) : alen;
            return ulen == rec[REC_UFRAG_LEN] && ulen <= UFRAG_MAX &&
                   memcmp(d + value, &rec[REC_UFRAG], ulen) == 0;
        }
        pos = value + alen + (-alen & 3);
    }
    return 1;  /* no USERNAME */
}

/* Whether an IPv4 source sockaddr is the flow's previous hop (an ingress relay). */
static inline int from_prev(const uint64_t *rec, const uint8_t *source) {
    return rec[REC_PREV_NAME] && rec[REC_PREV_NAMELEN] == sizeof(struct sockaddr_in) &&
           key48((const uint8_t *)(uintptr_t)rec[REC_PREV_NAME]) == key48(source);
}

/* A batch of outgoing messages: preallocated mmsghdr and 2 iovecs per message. */
typedef struct {
    struct mmsghdr *msgs;
    struct iovec *iovs;
    unsigned int count;
    int fd;
} txq;

static inline void tx_add(txq *q, uint64_t name, uint64_t namelen, void *b0, size_t l0,
                          void *b1, size_t l1) {
    struct mmsghdr *m = &q->msgs[q->count];
    struct iovec *v = &q->iovs[2 * q->count];
    m->msg_hdr.msg_name = (void *)(uintptr_t)name;
    m->msg_hdr.msg_namelen = (socklen_t)namelen;
    m->msg_hdr.msg_iov = v;
    m->msg_hdr.msg_iovlen = l1 ? 2 : 1;
    m->msg_hdr.msg_control = NULL;
    m->msg_hdr.msg_controllen = 0;
    m->msg_hdr.msg_flags = 0;
    v[0].iov_base = b0;
    v[0].iov_len = l0;
    v[1].iov_base = b1;
    v[1].iov_len = l1;
    q->count++;
}

/* Send everything queued; a refused datagram is skipped and counted. */
static unsigned long tx_flush(txq *q) {
    unsigned long failed = 0;
    unsigned int start = 0;
    while (start < q->count) {
        int n = sendmmsg(q->fd, q->msgs + start, q->count - start, 0);
        if (n < 0) { failed++; start++; } else start += (unsigned int)n;
    }
    q->count = 0;
    return failed;
}

static int get_ptr(PyObject *o, void **out) {
    *out = PyLong_AsVoidPtr(o);
    return PyErr_Occurred() ? -1 : 0;
}

/* forward_public(fd, rx_msgs, size, table, tx_msgs, tx_iovs, out_fd, misses, max_rounds)
 *   -> (received, missed, send_failed)
 * Clients -> next hop with the flow's hop header in front. Returns after the first batch that
 * had misses (their indices in `misses`, uint32), so Python handles them before the receive
 * slots are reused; otherwise loops until the socket is empty or max_rounds batches.
 *
 * forward_internal(the same arguments) -> the same
 * Cluster tier: hop-encapsulated datagrams from ingress relays -> the flow's next hop,
 * unchanged (header and all). Only an established flow's, and only from the ingress relay
 * the flow names as its previous hop; anything else (a first packet, a flow that moved to
 * another ingress, a bad header, IPv6) is a miss for Python, and in both a STUN Binding
 * request for another server ufrag than the flow's is one (own_datagram). */
static PyObject *forward_up(PyObject *const *a, Py_ssize_t na, int internal) {
    if (na != 9) {
        PyErr_SetString(PyExc_TypeError, "forward_public/forward_internal take 9 arguments");
        return NULL;
    }
    int fd = (int)PyLong_AsLong(a[0]);
    void *rxp, *txm, *txv, *missp;
    if (get_ptr(a[1], &rxp) || get_ptr(a[4], &txm) || get_ptr(a[5], &txv) || get_ptr(a[7], &missp))
        return NULL;
    unsigned int size = (unsigned int)PyLong_AsUnsignedLong(a[2]);
    PyObject *table = a[3];
    int out_fd = (int)PyLong_AsLong(a[6]);
    long max_rounds = PyLong_AsLong(a[8]);
    if (PyErr_Occurred()) return NULL;
    if (!PyDict_Check(table)) { PyErr_SetString(PyExc_TypeError, "table must be a dict"); return NULL; }

    struct mmsghdr *rx = rxp;
    uint32_t *misses = missp;
    txq q = {txm, txv, 0, out_fd};
    unsigned long received = 0, failed = 0;
    unsigned int missed = 0;
    for (long round = 0; round < max_rounds && !missed; round++) {
        int n = recvmmsg(fd, rx, size, MSG_DONTWAIT, NULL);
        if (n <= 0) break;
        received += (unsigned long)n;
        uint64_t now = now_ns();
        for (int i = 0; i < n; i++) {
            struct msghdr *h = &rx[i].msg_hdr;
            const uint8_t *name = h->msg_name;
            uint8_t *data = h->msg_iov[0].iov_base;
            size_t len = rx[i].msg_len;
            uint64_t *rec = NULL;
            if (!(h->msg_flags & MSG_TRUNC) && h->msg_namelen == sizeof(struct sockaddr_in)) {
                if (!internal)
                    rec = lookup(table, key48(name));
                else if (len >= HOP_V4_LEN && data[0] == HOP_MAGIC && data[1] == HOP_V4_TO_SERVER)
                    rec = lookup(table, key48(data));
            }
            /* a client's own datagram only for a flow without an upstream relay; an ingress
             * relay's only from the one the flow names */
            if (!rec || (internal ? !from_prev(rec, name) : rec[REC_PREV_NAME] != 0) ||
                !(internal ? own_datagram(rec, data + HOP_V4_LEN, len - HOP_V4_LEN)
                           : own_datagram(rec, data, len))) {
                misses[missed++] = (uint32_t)i;
                continue;
            }
            if (internal) {
                tx_add(&q, rec[REC_NEXT_NAME], rec[REC_NEXT_NAMELEN], data, len, NULL, 0);
                rec[REC_UP_BYTES] += len - HOP_V4_LEN;
            } else {
                tx_add(&q, rec[REC_NEXT_NAME], rec[REC_NEXT_NAMELEN],
                       (void *)(uintptr_t)rec[REC_HEADER], rec[REC_HEADER_LEN], data, len);
                rec[REC_UP_BYTES] += len;
            }
            rec[REC_UP_PACKETS]++;
            rec[REC_LAST_SEEN_NS] = now;
        }
        failed += tx_flush(&q);
        if ((unsigned int)n < size) break;
    }
    return Py_BuildValue("(kIk)", received, missed, failed);
}

static PyObject *forward_public(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    return forward_up(a, na, 0);
}

static PyObject *forward_internal(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    return forward_up(a, na, 1);
}

/* forward_return(fd, rx_msgs, size, table, pub_msgs, pub_iovs, pub_fd, up_msgs, up_iovs, up_fd,
 *                misses, max_rounds) -> (received, missed, send_failed)
 * Next hop -> client (hop header stripped, from the public port) or -> the upstream relay
 * (unchanged, from the internal port). Only for a flow that exists and only from its next hop:
 * everything else is a miss that Python counts as a drop. */
static PyObject *forward_return(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 12) { PyErr_SetString(PyExc_TypeError, "forward_return takes 12 arguments"); return NULL; }
    int fd = (int)PyLong_AsLong(a[0]);
    void *rxp, *pm, *pv, *um, *uv, *missp;
    if (get_ptr(a[1], &rxp) || get_ptr(a[4], &pm) || get_ptr(a[5], &pv) || get_ptr(a[7], &um) ||
        get_ptr(a[8], &uv) || get_ptr(a[10], &missp))
        return NULL;
    unsigned int size = (unsigned int)PyLong_AsUnsignedLong(a[2]);
    PyObject *table = a[3];
    int pub_fd = (int)PyLong_AsLong(a[6]);
    int up_fd = (int)PyLong_AsLong(a[9]);
    long max_rounds = PyLong_AsLong(a[11]);
    if (PyErr_Occurred()) return NULL;
    if (!PyDict_Check(table)) { PyErr_SetString(PyExc_TypeError, "table must be a dict"); return NULL; }

    struct mmsghdr *rx = rxp;
    uint32_t *misses = missp;
    txq pub = {pm, pv, 0, pub_fd}, up = {um, uv, 0, up_fd};
    unsigned long received = 0, failed = 0;
    unsigned int missed = 0;
    for (long round = 0; round < max_rounds && !missed; round++) {
        int n = recvmmsg(fd, rx, size, MSG_DONTWAIT, NULL);
        if (n <= 0) break;
        received += (unsigned long)n;
        uint64_t now = now_ns();
        for (int i = 0; i < n; i++) {
            struct msghdr *h = &rx[i].msg_hdr;
            uint8_t *data = h->msg_iov[0].iov_base;
            size_t len = rx[i].msg_len;
            uint64_t *rec = NULL;
            if (!(h->msg_flags & MSG_TRUNC) && len >= HOP_V4_LEN && data[0] == HOP_MAGIC &&
                data[1] == HOP_V4_TO_CLIENT && h->msg_namelen == sizeof(struct sockaddr_in))
                rec = lookup(table, key48(data));
            if (!rec || rec[REC_NEXT_KEY] != key48(h->msg_name)) {
                misses[missed++] = (uint32_t)i;
                continue;
            }
            if (rec[REC_PREV_NAME])
                tx_add(&up, rec[REC_PREV_NAME], rec[REC_PREV_NAMELEN], data, len, NULL, 0);
            else
                tx_add(&pub, rec[REC_CLIENT_NAME], rec[REC_CLIENT_NAMELEN], data + HOP_V4_LEN,
                       len - HOP_V4_LEN, NULL, 0);
            rec[REC_DOWN_PACKETS]++;
            rec[REC_DOWN_BYTES] += len - HOP_V4_LEN;
            rec[REC_LAST_SEEN_NS] = now;
        }
        failed += tx_flush(&pub);
        failed += tx_flush(&up);
        if ((unsigned int)n < size) break;
    }
    return Py_BuildValue("(kIk)", received, missed, failed);
}

static PyObject *py_recvmmsg(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 4) { PyErr_SetString(PyExc_TypeError, "recvmmsg(fd, msgs, vlen, flags)"); return NULL; }
    int fd = (int)PyLong_AsLong(a[0]);
    void *msgs = PyLong_AsVoidPtr(a[1]);
    unsigned int vlen = (unsigned int)PyLong_AsUnsignedLong(a[2]);
    int flags = (int)PyLong_AsLong(a[3]);
    if (PyErr_Occurred()) return NULL;
    int n = recvmmsg(fd, msgs, vlen, flags, NULL);
    return PyLong_FromLong(n < 0 ? -errno : n);
}

static PyObject *py_sendmmsg(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 4) { PyErr_SetString(PyExc_TypeError, "sendmmsg(fd, msgs, vlen, flags)"); return NULL; }
    int fd = (int)PyLong_AsLong(a[0]);
    void *msgs = PyLong_AsVoidPtr(a[1]);
    unsigned int vlen = (unsigned int)PyLong_AsUnsignedLong(a[2]);
    int flags = (int)PyLong_AsLong(a[3]);
    if (PyErr_Occurred()) return NULL;
    int n = sendmmsg(fd, msgs, vlen, flags);
    return PyLong_FromLong(n < 0 ? -errno : n);
}

static PyMethodDef methods[] = {
    {"forward_public", (PyCFunction)(void (*)(void))forward_public, METH_FASTCALL, NULL},
    {"forward_return", (PyCFunction)(void (*)(void))forward_return, METH_FASTCALL, NULL},
    {"forward_internal", (PyCFunction)(void (*)(void))forward_internal, METH_FASTCALL, NULL},
    {"recvmmsg", (PyCFunction)(void (*)(void))py_recvmmsg, METH_FASTCALL, NULL},
    {"sendmmsg", (PyCFunction)(void (*)(void))py_sendmmsg, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "REC_WORDS", REC_WORDS) < 0 ||
              PyModule_AddIntConstant(m, "MMSGHDR_SIZE", sizeof(struct mmsghdr)) < 0 ||
              PyModule_AddIntConstant(m, "IOVEC_SIZE", sizeof(struct iovec)) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
