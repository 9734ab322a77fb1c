/* The relay's first-packet admission in C: what admission.py and routing.py decide for an
 * IPv4 client datagram from an address without an established flow, without Python objects
 * per datagram (the worker's --admission native; docs/relay.md).
 *
 *   first()  a datagram from a client the worker has no flow for: its pending flow's, if it
 *            has one (STUN within the source's rate goes on to the flow's next hop), or a new
 *            pending flow (STUN, within the source's rate, a USERNAME whose server ufrag
 *            verifies and routes, within the per-IP, per-/24 and table caps, the oldest
 *            pending flow evicted from a full table). Returns the next hop's index and
 *            writes the 8-byte hop header towards the server, or a drop reason.
 *   take()   the next hop answered: the pending flow leaves, for Python to establish.
 *   allow()  the per-source token bucket (FirstPacketLimiter's rule), also for Python's own
 *            slow paths (Redis lookups, IPv6 and upstream pending flows), so one source has
 *            one bucket.
 *   sweep()  pending flows past their TTL go; full buckets are forgotten.
 *
 * Every table is preallocated from the caps at construction; bad input is a drop reason.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdint.h>
#include <string.h>

#define STUN_HEADER 20
#define STUN_COOKIE 0x2112A442u
#define ATTR_USERNAME 0x0006
#define UFRAG_LEN 20                   /* services/wire/ufrag.py */
#define UFRAG_BODY 10
#define UFRAG_TAG 5
#define UFRAG_VERSION 1
#define HOP_MAGIC 0x0E
#define HOP_TO_SERVER 0x00
#define MAX_ID 0xFFF

/* Drop reasons, named as in services/relay/counters.py's DROP_REASONS. */
enum { R_RATE_LIMITED, R_STUN_MALFORMED, R_STUN_NO_USERNAME, R_BAD_UFRAG, R_NO_ROUTE,
       R_PENDING_PER_IP, R_PENDING_PER_PREFIX, R_FLOW_TABLE_FULL, R_PENDING_NOT_STUN,
       R_COUNT };
#define NOT_STUN (-1 - R_COUNT)   /* not STUN, no pending flow: Python's (Redis, or dropped) */
static const char *REASONS[R_COUNT] = {
    "rate_limited", "stun_malformed", "stun_no_username", "bad_ufrag", "no_route",
    "pending_per_ip", "pending_per_prefix", "flow_table_full", "pending_not_stun",
};

/* ------------------------------------------------------------------ a u64 -> int32 map */

/* Linear probing with backward-shift deletion (no tombstones); keys are never ~0. */
typedef struct {
    uint64_t *keys;
    int32_t *values;
    unsigned mask, count;
} Map;

#define EMPTY UINT64_MAX

static int map_init(Map *m, unsigned entries) {
    unsigned size = 16;
    while (size < entries * 2) size <<= 1;
    m->keys = PyMem_Malloc(size * sizeof(uint64_t));
    m->values = PyMem_Malloc(size * sizeof(int32_t));
    if (!m->keys || !m->values) return -1;
    memset(m->keys, 0xFF, size * sizeof(uint64_t));
    m->mask = size - 1;
    m->count = 0;
    return 0;
}

static void map_free(Map *m) {
    PyMem_Free(m->keys);
    PyMem_Free(m->values);
    m->keys = NULL;
    m->values = NULL;
}

static inline unsigned map_hash(uint64_t k, unsigned mask) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33;
    return (unsigned)k & mask;
}

static int32_t *map_get(Map *m, uint64_t key) {
    for (unsigned i = map_hash(key, m->mask);; i = (i + 1) & m->mask) {
        if (m->keys[i] == key) return &m->values[i];
        if (m->keys[i] == EMPTY) return NULL;
    }
}

/* The value slot of ``key``, inserted as 0 when absent (the caller keeps count < size/2). */
static int32_t *map_put(Map *m, uint64_t key) {
    unsigned i = map_hash(key, m->mask);
    for (; m->keys[i] != EMPTY; i = (i + 1) & m->mask)
        if (m->keys[i] == key) return &m->values[i];
    m->keys[i] = key;
    m->values[i] = 0;
    m->count++;
    return &m->values[i];
}

static void map_del(Map *m, uint64_t key) {
    unsigned i = map_hash(key, m->mask);
    while (m->keys[i] != key) {
        if (m->keys[i] == EMPTY) return;
        i = (i + 1) & m->mask;
    }
    m->count--;
    for (unsigned j = (i + 1) & m->mask; m->keys[j] != EMPTY; j = (j + 1) & m->mask) {
        unsigned home = map_hash(m->keys[j], m->mask);
        /* move j back into the hole at i unless its home lies cyclically in (i, j] */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            m->keys[i] = m->keys[j];
            m->values[i] = m->values[j];
            i = j;
        }
    }
    m->keys[i] = EMPTY;
}

/* A count per key: +1, or -1 with the key gone at 0. */
static void count_add(Map *m, uint64_t key, int delta) {
    int32_t *v = map_put(m, key);
    *v += delta;
    if (*v <= 0) map_del(m, key);
}

static int32_t count_of(Map *m, uint64_t key) {
    int32_t *v = map_get(m, key);
    return v ? *v : 0;
}

/* ------------------------------------------------------------------ the type */

typedef struct {
    uint64_t key;                       /* the client's (port, IPv4) as the flow key */
    uint32_t ip, prefix;
    int32_t hop, cluster, transceiver;
    int64_t created;
    uint64_t packets, bytes;            /* client bytes forwarded while pending */
    int32_t older, newer;               /* creation order: -1 ends */
} Pending;

typedef struct {
    double tokens;
    int64_t at;
} Bucket;

typedef struct {
    PyObject_HEAD
    uint8_t secret[256];
    int secret_len;
    int ingress;                        /* route by cluster id; else by transceiver id */
    int cluster_id;                     /* the cluster tier's own cluster */
    int32_t routes[MAX_ID + 1];         /* id -> next hop index, -1 none */
    /* the limiter */
    double rate_per_ns, burst;
    unsigned max_sources;
    Map bucket_of;                      /* source key -> index into buckets */
    Bucket *buckets;                    /* dense: 0 .. nbuckets - 1 */
    uint64_t *bucket_keys;              /* each bucket's source key, for the sweep */
    unsigned nbuckets;
    uint64_t untracked;
    /* pending flows */
    unsigned cap, per_ip, per_prefix;
    int64_t ttl_ns;
    Pending *pending;
    int32_t *free_slots;
    unsigned nfree;
    int32_t oldest, newest;
    Map by_key, per_ip_count, per_prefix_count;
    uint64_t created, expired, evicted, taken;
    uint64_t live_packets, live_bytes, gone_packets, gone_bytes;
} Admission;

static inline uint64_t source_key(const uint8_t *ip, Py_ssize_t n) {
    if (n == 4) return (uint64_t)ip[0] << 24 | (uint64_t)ip[1] << 16 | (uint64_t)ip[2] << 8 | ip[3];
    /* IPv6 and anything else: a 64-bit digest above the IPv4 range (collisions share a
       bucket; they cannot make a source skip the limit) */
    uint64_t h = 0xcbf29ce484222325ull;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ ip[i]) * 0x100000001b3ull;
    return h | (1ull << 40);
}

static int limiter_allow(Admission *a, uint64_t source, int64_t now) {
    if (a->rate_per_ns <= 0) return 1;
    int32_t *slot = map_get(&a->bucket_of, source);
    if (!slot) {
        if (a->nbuckets >= a->max_sources) { a->untracked++; return 1; }
        unsigned b = a->nbuckets++;
        *map_put(&a->bucket_of, source) = (int32_t)b;
        a->bucket_keys[b] = source;
        a->buckets[b].tokens = a->burst - 1.0;
        a->buckets[b].at = now;
        return 1;
    }
    Bucket *b = &a->buckets[*slot];
    double tokens = b->tokens + (double)(now - b->at) * a->rate_per_ns;
    if (tokens > a->burst) tokens = a->burst;
    b->at = now;
    if (tokens < 1.0) { b->tokens = tokens; return 0; }
    b->tokens = tokens - 1.0;
    return 1;
}

/* Forget the buckets that have refilled; the others move down to stay dense. The work is the
 * live buckets', not the map's size: walking and clearing the whole map (sized for max_sources,
 * 2 MB at the default) held the relay's worker 0.13 ms every sweep, 0.3-0.5 ms under the
 * hostile flood, and every call datagram behind it (docs/relay.md, "Under a flood"). */
static void limiter_sweep(Admission *a, int64_t now) {
    if (a->rate_per_ns <= 0) return;
    unsigned kept = 0;
    for (unsigned i = 0; i < a->nbuckets; i++) {
        const Bucket b = a->buckets[i];
        const uint64_t key = a->bucket_keys[i];
        if (b.tokens + (double)(now - b.at) * a->rate_per_ns >= a->burst) {
            map_del(&a->bucket_of, key);
            continue;
        }
        if (kept != i) {
            a->buckets[kept] = b;
            a->bucket_keys[kept] = key;
            *map_get(&a->bucket_of, key) = (int32_t)kept;
        }
        kept++;
    }
    a->nbuckets = kept;
}

static void pending_unlink(Admission *a, int32_t idx, int gone) {
    Pending *p = &a->pending[idx];
    if (p->older >= 0) a->pending[p->older].newer = p->newer; else a->oldest = p->newer;
    if (p->newer >= 0) a->pending[p->newer].older = p->older; else a->newest = p->older;
    map_del(&a->by_key, p->key);
    count_add(&a->per_ip_count, p->ip, -1);
    count_add(&a->per_prefix_count, p->prefix, -1);
    a->live_packets -= p->packets;
    a->live_bytes -= p->bytes;
    if (gone) {
        a->gone_packets += p->packets;
        a->gone_bytes += p->bytes;
    }
    a->free_slots[a->nfree++] = idx;
}

/* Whether ``d`` is framed as a STUN message (services/wire/stun.py's is_stun): header and
 * cookie, a length that is a multiple of 4 and fits. */
static int is_stun(const uint8_t *d, Py_ssize_t n) {
    if (n < STUN_HEADER || (d[0] & 0xC0)) return 0;
    unsigned length = (unsigned)d[2] << 8 | d[3];
    uint32_t cookie = (uint32_t)d[4] << 24 | (uint32_t)d[5] << 16 | (uint32_t)d[6] << 8 | d[7];
    return cookie == STUN_COOKIE && length % 4 == 0 && STUN_HEADER + (Py_ssize_t)length <= n;
}

/* The server ufrag's (cluster, transceiver), or a drop reason (negative, -1 - reason). */
static int route_of(Admission *a, const uint8_t *d, Py_ssize_t n, int *cluster, int *transceiver) {
    if (!is_stun(d, n)) return -1 - R_STUN_MALFORMED;
    Py_ssize_t end = STUN_HEADER + ((d[2] << 8) | d[3]), pos = STUN_HEADER;
    const uint8_t *user = NULL;
    Py_ssize_t user_len = 0;
    while (pos + 4 <= end) {
        unsigned type = (unsigned)d[pos] << 8 | d[pos + 1], alen = (unsigned)d[pos + 2] << 8 | d[pos + 3];
        Py_ssize_t value_end = pos + 4 + alen;
        if (value_end > end) return -1 - R_STUN_MALFORMED;
        if (type == ATTR_USERNAME) { user = d + pos + 4; user_len = alen; break; }
        pos = value_end + ((4 - alen % 4) % 4);
    }
    if (!user) return -1 - R_STUN_NO_USERNAME;
    Py_ssize_t ufrag_len = 0;
    while (ufrag_len < user_len && user[ufrag_len] != ':') ufrag_len++;
    if (ufrag_len != UFRAG_LEN) return -1 - R_BAD_UFRAG;
    uint8_t blob[15];
    uint32_t acc = 0;
    for (int i = 0; i < UFRAG_LEN; i++) {
        uint8_t c = user[i], v;
        if (c >= 'A' && c <= 'Z') v = c - 'A';
        else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
        else if (c >= '0' && c <= '9') v = c - '0' + 52;
        else if (c == '+') v = 62;
        else if (c == '/') v = 63;
        else return -1 - R_BAD_UFRAG;
        acc = acc << 6 | v;
        if (i % 4 == 3) {
            blob[i / 4 * 3] = (uint8_t)(acc >> 16);
            blob[i / 4 * 3 + 1] = (uint8_t)(acc >> 8);
            blob[i / 4 * 3 + 2] = (uint8_t)acc;
            acc = 0;
        }
    }
    uint8_t mac[EVP_MAX_MD_SIZE];
    unsigned mac_len = 0;
    if (!HMAC(EVP_sha256(), a->secret, a->secret_len, blob, UFRAG_BODY, mac, &mac_len) ||
        CRYPTO_memcmp(mac, blob + UFRAG_BODY, UFRAG_TAG) != 0)
        return -1 - R_BAD_UFRAG;
    if (blob[0] != UFRAG_VERSION) return -1 - R_BAD_UFRAG;
    uint32_t ids = (uint32_t)blob[1] << 16 | (uint32_t)blob[2] << 8 | blob[3];
    *cluster = (int)(ids >> 12);
    *transceiver = (int)(ids & MAX_ID);
    return 0;
}

static int Admission_init(Admission *a, PyObject *args, PyObject *kw) {
    static char *names[] = {"secret", "ingress", "cluster_id", "routes", "rate", "burst",
                            "max_sources", "cap", "per_ip", "per_prefix", "ttl_ns", NULL};
    Py_buffer secret;
    int ingress, cluster_id;
    PyObject *routes;
    double rate, burst;
    unsigned max_sources, cap, per_ip, per_prefix;
    long long ttl_ns;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*piO!ddIIIIL", names, &secret, &ingress,
                                     &cluster_id, &PyDict_Type, &routes, &rate, &burst,
                                     &max_sources, &cap, &per_ip, &per_prefix, &ttl_ns))
        return -1;
    int ok = 0;
    if (a->pending) { PyErr_SetString(PyExc_RuntimeError, "initialised once"); goto done; }
    if (secret.len < 16 || secret.len > (Py_ssize_t)sizeof a->secret) {
        PyErr_SetString(PyExc_ValueError, "the secret must be 16-256 bytes");
        goto done;
    }
    if (cap < 1 || cap > (1u << 24) || max_sources > (1u << 24) || ttl_ns <= 0 ||
        !(rate >= 0) || !(burst >= 1) || !isfinite(rate) || !isfinite(burst)) {
        PyErr_SetString(PyExc_ValueError, "bad admission limits");
        goto done;
    }
    memcpy(a->secret, secret.buf, secret.len);
    a->secret_len = (int)secret.len;
    a->ingress = ingress;
    a->cluster_id = cluster_id;
    for (int i = 0; i <= MAX_ID; i++) a->routes[i] = -1;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(routes, &pos, &k, &v)) {
        long id = PyLong_AsLong(k), hop = PyLong_AsLong(v);
        if (PyErr_Occurred() || id < 0 || id > MAX_ID || hop < 0 || hop > INT32_MAX) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "routes: {id 0-4095: next hop index}");
            goto done;
        }
        a->routes[id] = (int32_t)hop;
    }
    a->rate_per_ns = rate / 1e9;
    a->burst = burst;
    a->max_sources = max_sources;
    a->cap = cap;
    a->per_ip = per_ip;
    a->per_prefix = per_prefix;
    a->ttl_ns = ttl_ns;
    a->buckets = PyMem_Malloc((max_sources ? max_sources : 1) * sizeof(Bucket));
    a->bucket_keys = PyMem_Malloc((max_sources ? max_sources : 1) * sizeof(uint64_t));
    a->pending = PyMem_Malloc(cap * sizeof(Pending));
    a->free_slots = PyMem_Malloc(cap * sizeof(int32_t));
    if (!a->buckets || !a->bucket_keys || !a->pending || !a->free_slots ||
        map_init(&a->bucket_of, max_sources ? max_sources : 1) < 0 ||
        map_init(&a->by_key, cap) < 0 || map_init(&a->per_ip_count, cap) < 0 ||
        map_init(&a->per_prefix_count, cap) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    for (unsigned i = 0; i < cap; i++) a->free_slots[i] = (int32_t)(cap - 1 - i);
    a->nfree = cap;
    a->oldest = a->newest = -1;
    ok = 1;
done:
    PyBuffer_Release(&secret);
    return ok ? 0 : -1;
}

static void Admission_dealloc(Admission *a) {
    map_free(&a->bucket_of);
    map_free(&a->by_key);
    map_free(&a->per_ip_count);
    map_free(&a->per_prefix_count);
    PyMem_Free(a->buckets);
    PyMem_Free(a->bucket_keys);
    PyMem_Free(a->pending);
    PyMem_Free(a->free_slots);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

static PyObject *Admission_first(Admission *a, PyObject *args) {
    Py_buffer data, client;
    long long now;
    long long room;
    unsigned long long header_addr;
    if (!PyArg_ParseTuple(args, "y*y*LLK", &data, &client, &now, &room, &header_addr))
        return NULL;
    long result;
    const uint8_t *c = client.buf, *d = data.buf;
    if (client.len < 8 || (c[0] | c[1] << 8) != 2 /* AF_INET */ || header_addr == 0) {
        PyErr_SetString(PyExc_ValueError, "an IPv4 sockaddr and a header buffer are needed");
        result = -1000;
        goto done;
    }
    uint64_t key = 0;
    for (int i = 7; i >= 2; i--) key = key << 8 | c[i];
    uint32_t ip = (uint32_t)c[4] << 24 | (uint32_t)c[5] << 16 | (uint32_t)c[6] << 8 | c[7];
    uint32_t prefix = ip >> 8;
    int32_t *known = map_get(&a->by_key, key);
    if (known) {   /* a pending flow: STUN only, within the source's rate */
        Pending *p = &a->pending[*known];
        if (!is_stun(d, data.len)) {
            result = -1 - R_PENDING_NOT_STUN;
            goto done;
        }
        if (!limiter_allow(a, ip, now)) { result = -1 - R_RATE_LIMITED; goto done; }
        p->packets++;
        p->bytes += (uint64_t)data.len;
        a->live_packets++;
        a->live_bytes += (uint64_t)data.len;
        result = p->hop;
    } else {
        if (data.len == 0 || d[0] > 3) { result = NOT_STUN; goto done; }   /* RFC 7983 */
        if (!limiter_allow(a, ip, now)) { result = -1 - R_RATE_LIMITED; goto done; }
        int cluster = 0, transceiver = 0;
        int e = route_of(a, d, data.len, &cluster, &transceiver);
        if (e < 0) { result = e; goto done; }
        int32_t hop = a->ingress ? a->routes[cluster]
                    : cluster == a->cluster_id ? a->routes[transceiver] : -1;
        if (hop < 0) { result = -1 - R_NO_ROUTE; goto done; }
        if ((unsigned)count_of(&a->per_ip_count, ip) >= a->per_ip) {
            result = -1 - R_PENDING_PER_IP;
            goto done;
        }
        if ((unsigned)count_of(&a->per_prefix_count, prefix) >= a->per_prefix) {
            result = -1 - R_PENDING_PER_PREFIX;
            goto done;
        }
        if (room <= 0 && a->oldest < 0) { result = -1 - R_FLOW_TABLE_FULL; goto done; }
        if (a->nfree == 0 || room <= 0) {   /* full: the oldest pending flow goes */
            pending_unlink(a, a->oldest, 1);
            a->evicted++;
        }
        int32_t idx = a->free_slots[--a->nfree];
        Pending *p = &a->pending[idx];
        *p = (Pending){.key = key, .ip = ip, .prefix = prefix, .hop = hop, .cluster = cluster,
                       .transceiver = transceiver, .created = now, .packets = 1,
                       .bytes = (uint64_t)data.len, .older = a->newest, .newer = -1};
        if (a->newest >= 0) a->pending[a->newest].newer = idx; else a->oldest = idx;
        a->newest = idx;
        *map_put(&a->by_key, key) = idx;
        count_add(&a->per_ip_count, ip, 1);
        count_add(&a->per_prefix_count, prefix, 1);
        a->created++;
        a->live_packets++;
        a->live_bytes += (uint64_t)data.len;
        result = hop;
    }
    uint8_t *h = (uint8_t *)(uintptr_t)header_addr;
    h[0] = HOP_MAGIC;
    h[1] = HOP_TO_SERVER;
    memcpy(h + 2, c + 2, 6);   /* port and address, as a sockaddr_in has them */
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&client);
    return result == -1000 ? NULL : PyLong_FromLong(result);
}

static PyObject *Admission_hop_of(Admission *a, PyObject *arg) {
    uint64_t key = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    int32_t *known = key == EMPTY ? NULL : map_get(&a->by_key, key);
    return PyLong_FromLong(known ? a->pending[*known].hop : -1);
}

static PyObject *Admission_take(Admission *a, PyObject *arg) {
    uint64_t key = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    int32_t *known = key == EMPTY ? NULL : map_get(&a->by_key, key);
    if (!known) Py_RETURN_NONE;
    int32_t idx = *known;
    Pending p = a->pending[idx];
    pending_unlink(a, idx, 0);
    a->taken++;
    return Py_BuildValue("iiiLKK", p.hop, p.cluster, p.transceiver, (long long)p.created,
                         (unsigned long long)p.packets, (unsigned long long)p.bytes);
}

static PyObject *Admission_forget(Admission *a, PyObject *arg) {
    uint64_t key = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    int32_t *known = key == EMPTY ? NULL : map_get(&a->by_key, key);
    if (!known) Py_RETURN_FALSE;
    pending_unlink(a, *known, 1);
    Py_RETURN_TRUE;
}

static PyObject *Admission_allow(Admission *a, PyObject *args) {
    Py_buffer ip;
    long long now;
    if (!PyArg_ParseTuple(args, "y*L", &ip, &now)) return NULL;
    int ok = limiter_allow(a, source_key(ip.buf, ip.len), now);
    PyBuffer_Release(&ip);
    return PyBool_FromLong(ok);
}

static PyObject *Admission_sweep(Admission *a, PyObject *arg) {
    long long now = PyLong_AsLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    unsigned long expired = 0;
    while (a->oldest >= 0 && now - a->pending[a->oldest].created >= a->ttl_ns) {
        pending_unlink(a, a->oldest, 1);
        expired++;
    }
    a->expired += expired;
    limiter_sweep(a, now);
    return PyLong_FromUnsignedLong(expired);
}

static PyObject *Admission_counters(Admission *a, PyObject *noargs) {
    return Py_BuildValue(
        "{sIsKsKsKsKsKsKsKsKsIsK}", "pending", a->cap - a->nfree, "created", a->created,
        "expired", a->expired, "evicted", a->evicted, "taken", a->taken,
        "live_packets", a->live_packets, "live_bytes", a->live_bytes,
        "gone_packets", a->gone_packets, "gone_bytes", a->gone_bytes,
        "sources", a->nbuckets, "untracked", a->untracked);
}

static Py_ssize_t Admission_len(Admission *a) { return (Py_ssize_t)(a->cap - a->nfree); }

static PyObject *Admission_get_untracked(Admission *a, void *c) {
    return PyLong_FromUnsignedLongLong(a->untracked);
}

static PyObject *Admission_get_enabled(Admission *a, void *c) {
    return PyBool_FromLong(a->rate_per_ns > 0);
}

static PyMethodDef Admission_methods[] = {
    {"first", (PyCFunction)Admission_first, METH_VARARGS,
     "first(datagram, client_sockaddr, now_ns, room, header_addr) -> next hop index, "
     "-1 - index into REASONS, or NOT_STUN"},
    {"hop_of", (PyCFunction)Admission_hop_of, METH_O, "hop_of(key) -> the pending flow's next hop, or -1"},
    {"take", (PyCFunction)Admission_take, METH_O,
     "take(key) -> (hop, cluster, transceiver, created_ns, packets, bytes) or None"},
    {"forget", (PyCFunction)Admission_forget, METH_O, "forget(key) -> whether a pending flow went"},
    {"allow", (PyCFunction)Admission_allow, METH_VARARGS, "allow(ip, now_ns) -> bool"},
    {"sweep", (PyCFunction)Admission_sweep, METH_O, "sweep(now_ns) -> pending flows expired"},
    {"counters", (PyCFunction)Admission_counters, METH_NOARGS, "counters() -> dict"},
    {NULL}
};

static PyGetSetDef Admission_getset[] = {
    {"untracked", (getter)Admission_get_untracked, NULL, "sources let through untracked", NULL},
    {"enabled", (getter)Admission_get_enabled, NULL, "whether the rate limit applies", NULL},
    {NULL}
};

static PySequenceMethods Admission_sequence = {.sq_length = (lenfunc)Admission_len};

static PyTypeObject AdmissionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "services.relay._admission.Admission",
    .tp_basicsize = sizeof(Admission),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A worker's first-packet admission and pending flows (IPv4).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Admission_init,
    .tp_dealloc = (destructor)Admission_dealloc,
    .tp_methods = Admission_methods,
    .tp_getset = Admission_getset,
    .tp_as_sequence = &Admission_sequence,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_admission",
                                    "The relay's first-packet admission in C.", -1, NULL};

PyMODINIT_FUNC PyInit__admission(void) {
    if (PyType_Ready(&AdmissionType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *reasons = PyTuple_New(R_COUNT);
    if (!reasons) { Py_DECREF(m); return NULL; }
    for (int i = 0; i < R_COUNT; i++) PyTuple_SET_ITEM(reasons, i, PyUnicode_FromString(REASONS[i]));
    Py_INCREF(&AdmissionType);
    if (PyModule_AddIntConstant(m, "NOT_STUN", NOT_STUN) < 0 ||
        PyModule_AddObject(m, "REASONS", reasons) < 0 ||
        PyModule_AddObject(m, "Admission", (PyObject *)&AdmissionType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
