/* The transceiver's native media plane: every established session's RTP on the shared socket.
 *
 * aiortc and aioice keep the control: ICE, DTLS, SDP, RTCP, the session's lifecycle. Once a
 * session's DTLS is done, Python hands its SRTP keys and RTP parameters here (Plane.add) and
 * from then on the session's RTP never reaches Python:
 *
 *   in   recvmmsg batches off the shared socket; a datagram (after the relay's hop header, if
 *        any) from a native session's client address whose first byte says RTP (RFC 7983,
 *        128-191, and not RTCP's packet types 192-223) is unprotected with libsrtp, counted
 *        into the session's receive statistics (RFC 3550 A.1/A.8, as aiortc's
 *        StreamStatistics) and its payload queued for the agent: the Opus payload itself, or
 *        decoded to 20 ms of PCM (libopus) in pcm16 mode. Everything else (STUN, DTLS, SRTCP,
 *        unknown addresses) is returned to Python unchanged, with its source address.
 *   agent take_batch() packs every session's queued frames into one buffer of records
 *        [u32 channel][u16 length][payload] (network order), put_batch() queues the agent's
 *        records for sending (pcm16: a 1920-byte PCM frame encoded to Opus first, a record of
 *        1-1275 bytes sent as the Opus payload it is).
 *   out  tick(frames): per session and 20 ms frame, the next queued payload (or the silence
 *        packet), as an RTP packet with the session's SSRC, sequence and timestamp and its
 *        one-byte header extensions (mid, abs-send-time), protected with libsrtp, and sent in
 *        sendmmsg batches, with the hop header towards the client when it came through a
 *        relay.
 *
 * A session may also own a socket of its own (``fd``): a port-per-session transceiver's, or
 * a light load client's after its own DTLS handshake in aiortc. Its datagrams are read with
 * read_session(channel), must come from the session's peer, and it sends on that socket. A
 * client session is one given a ``script`` (pre-encoded Opus payloads): it sends the script
 * in a loop when nothing is queued, keeps nothing of what it hears, and logs every packet's
 * arrival (take_arrivals) for the client's own statistics; a client session that ``keep``s
 * what it hears (a conversation's caller) also logs each packet's payload with its wall-clock
 * arrival, sequence number and timestamp (take_heard), for the caller's playout rule in
 * Python, which hands the frames back in playout order to be decoded with libopus here
 * (decode). A session on its own socket may
 * also go through a TURN server (``turn_channel``, RFC 8656 12: its ``client`` is then the
 * server): what it sends is ChannelData of that channel, and only ChannelData of that channel
 * from the server reaches it; everything else on the socket (the allocation's STUN, other
 * channels, the peer's DTLS and STUN inside the channel) goes back to Python unchanged.
 *
 * Bad input is dropped and counted by reason (counters()), never a crash: a packet reaches
 * only the session its address was learned for, and a session removed while packets of it
 * are in a batch just stops matching. Everything is preallocated when the plane is made.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <opus/opus.h>
#include <srtp2/srtp.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "srtp_gcm.h"

#define HOP_MAGIC 0x0E
#define HOP_V4_LEN 8
#define CHANNEL_LEN 4           /* a TURN ChannelData header: channel number, length */
#define CHANNEL_MIN 0x4000      /* RFC 8656 12: 0x4000-0x4FFF */
#define CHANNEL_MAX 0x4FFF
#define BATCH 64                /* datagrams per recvmmsg / sendmmsg */
#define SLOT_BYTES 2048         /* a datagram larger than this is not media: truncated, to Python */
#define FRAME_MAX 1920          /* a queued frame: 20 ms of mono PCM, or an Opus payload */
#define PCM_SAMPLES 960
#define RING 8                  /* frames queued per session and direction */
#define OUT_KEEP 5              /* frames queued towards the client before the oldest goes */
/* pcm sessions: silent frames encoded after the agent's audio ends, before the cached silence
 * packet (as services/transceiver/media.py's _CODED_SILENCE): the client's decoder hears the
 * sound end as the encoder shaped it, and the encoder starts the next audio from silence, not
 * from the middle of the last word (a cut reply's next reply began with a glitch: PESQ 4.18
 * against 4.40, docs/conversation.md) */
#define CODED_SILENCE 3
#define GAPS 16                 /* arrival gaps kept until Python reads them */
#define GAP_NS 60000000ll       /* 60 ms: services/gaps.py's threshold */
#define RTP_MAX (SLOT_BYTES - HOP_V4_LEN - SRTP_MAX_TRAILER_LEN)
#define ARRIVALS 2048           /* arrivals logged until Python takes them */
#define HEARD_BYTES 65536       /* a keeping client's heard packets until Python takes them */
#define HEARD_HEAD 16           /* before each: arrival (f64, wall clock), seq (u16), RTP
                                   timestamp (u32), payload length (u16), native order */
#define OPUS_MAX 1275           /* the largest Opus packet (RFC 6716 3.2.1) */
#define LSRS 4                  /* our SRs an RR may answer (the latest few) */
#define RTT_ALPHA 0.85          /* aiortc's smoothing of the RTT (rtcrtpsender.py) */
#define SSRCS 4                 /* remote SSRCs a session may use: libsrtp keeps a stream each,
                                   in a list it walks per packet, so their number is bounded */

typedef struct {
    double at;                  /* CLOCK_MONOTONIC seconds (Python's time.monotonic()) */
    uint32_t ssrc;
    uint16_t seq, size;
} Arrival;

/* Drop and pass reasons. */
enum {
    C_DATAGRAMS, C_TO_PYTHON, C_RTP_IN, C_RTP_OUT, C_BYTES_IN, C_BYTES_OUT,
    C_DROP_SRTP_AUTH, C_DROP_SRTP_REPLAY, C_DROP_SRTP_OTHER, C_DROP_RTP_MALFORMED,
    C_DROP_FRAME_TOO_BIG, C_DROP_DECODE, C_DROP_IN_QUEUE_FULL, C_DROP_OUT_QUEUE_FULL,
    C_BATCH_BAD_RECORD, C_BATCH_UNKNOWN_CHANNEL, C_DROP_ENCODE, C_SEND_ERRORS, C_SSRC_CHANGES,
    C_RECV_TRUNCATED, C_WRONG_PEER, C_ARRIVALS_LOST, C_DROP_SSRC_LIMIT, C_NOT_IPV4,
    C_RTCP_IN, C_RTCP_OUT, C_DROP_RTCP_AUTH, C_DROP_RTCP_REPLAY, C_DROP_RTCP_OTHER,
    C_DROP_RTCP_MALFORMED, C_RTCP_BAD_PART, C_RTCP_BYE, C_HEARD_LOST, C_COUNTERS
};
static const char *COUNTER_NAMES[C_COUNTERS] = {
    "datagrams", "to_python", "rtp_in", "rtp_out", "bytes_in", "bytes_out",
    "drop_srtp_auth", "drop_srtp_replay", "drop_srtp_other", "drop_rtp_malformed",
    "drop_frame_too_big", "drop_decode", "drop_in_queue_full", "drop_out_queue_full",
    "batch_bad_record", "batch_unknown_channel", "drop_encode", "send_errors", "ssrc_changes",
    "recv_truncated", "wrong_peer", "arrivals_lost", "drop_ssrc_limit", "not_ipv4",
    "rtcp_in", "rtcp_out", "drop_rtcp_auth", "drop_rtcp_replay", "drop_rtcp_other",
    "drop_rtcp_malformed", "rtcp_bad_part", "rtcp_bye", "heard_lost",
};

typedef struct {
    uint16_t len;
    uint8_t data[FRAME_MAX];
} Frame;

typedef struct {
    Frame frames[RING];
    unsigned head, count;
} Ring;

typedef struct {
    int used;
    uint32_t channel;
    uint64_t key;                       /* client (port, IPv4) as 48 bits, hop-header layout */
    struct sockaddr_in client;
    int relayed;
    struct sockaddr_in relay;           /* the relay that last delivered the client */
    uint8_t hop[HOP_V4_LEN];            /* the header towards the client */
    srtp_t rx, tx;                      /* libsrtp's, or */
    GcmSide *grx, *gtx;                 /* the plane's own for the GCM profiles (srtp_gcm.c) */
    int pcm;                            /* pcm16 towards the agent: decode and encode here */
    uint8_t coded_silence;              /* pcm: silent frames encoded since the audio ended */
    OpusDecoder *dec;
    OpusEncoder *enc;
    /* receive statistics */
    int have_ssrc;
    uint32_t rx_ssrc;
    uint32_t ssrcs[SSRCS];              /* the remote SSRCs that authenticated, in order */
    unsigned nssrcs;
    uint32_t packets_received, cycles;
    uint16_t base_seq, max_seq;
    int64_t jitter_q4;
    int64_t last_arrival;               /* in the clock rate's units */
    uint32_t last_ts;
    int64_t last_ns;                    /* monotonic arrival of the previous packet */
    double first_wall, last_wall;       /* the first and latest packet's arrival (wall clock) */
    double gaps[GAPS][2];               /* (start: wall clock of the packet before, seconds) */
    unsigned ngaps, gaps_lost;
    /* send state */
    uint32_t ssrc, timestamp, packets_sent, octets_sent;
    uint16_t seq;
    uint8_t pt, mid_id, ast_id, mid_len;
    uint8_t mid[16];
    uint64_t last_ntp;                  /* NTP time and RTP timestamp of the last packet sent */
    uint32_t last_rtp_ts;
    uint16_t silence_len;
    uint8_t silence[64];
    Ring in, out;
    /* RTCP, when the plane keeps it (rtcp): reports sent every 0.5-1.5 s, reports read */
    int rtcp;
    uint8_t cname[64], cname_len;
    int64_t next_rtcp_ns;
    uint32_t sr_lsr;                    /* the peer's last SR: NTP middle 32 bits, */
    int64_t sr_at_ns;                   /* and its arrival (monotonic) */
    uint32_t expected_prior, received_prior;
    uint32_t our_lsr[LSRS];             /* our last SRs, as the peer's LSR will name them */
    unsigned nlsr;
    double rtt_s, rtt_last_s;           /* smoothed as aiortc smooths it (RTT_ALPHA), latest */
    uint32_t rtt_samples, rtcp_in, rtcp_out;
    int remote_report, bye;             /* the peer's last report block on our stream: */
    uint8_t remote_fraction;
    int32_t remote_lost;
    uint32_t remote_highest, remote_jitter;
    /* a session with a socket of its own (a client's) */
    int fd;                             /* -1: the plane's shared socket */
    uint16_t turn_channel;              /* on fd, through a TURN server (0: direct) */
    uint8_t *script;                    /* payloads sent in a loop when nothing is queued */
    uint16_t *script_len;
    uint32_t *script_off;
    unsigned script_n, script_pos;
    Arrival *arrivals;                  /* logged arrivals (client sessions) */
    unsigned narrivals;
    uint8_t *heard;                     /* a keeping client's heard packets (HEARD_HEAD each) */
    unsigned heard_len;
    unsigned order_pos;                 /* where its slot is in Plane.order */
    uint8_t group;                      /* tick(frames, group) sends for this group's sessions */
} Session;

typedef struct {
    PyObject_HEAD
    int fd;
    unsigned capacity;
    Session *sessions;
    int32_t *table;                     /* open addressing: index into sessions, -1 empty */
    unsigned table_size;
    unsigned live, tombstones;
    uint16_t *order;                    /* the live sessions' slots, packed: the per-tick loops
                                           walk these, not every slot of ``capacity`` (a
                                           Session is ~31 KB: a slot is a page apart) */
    uint64_t counters[C_COUNTERS];
    /* receive batch */
    struct mmsghdr rmsgs[BATCH];
    struct iovec riov[BATCH];
    struct sockaddr_in rnames[BATCH];
    union { char buf[CMSG_SPACE(sizeof(struct timespec))]; struct cmsghdr align; } rctl[BATCH];
    double rx_wall;                     /* the datagram being handled arrived then (wall clock):
                                           the kernel's receive time where the socket gave it */
    uint8_t *rbuf;
    /* send batch */
    struct mmsghdr smsgs[BATCH];
    struct iovec siov[BATCH];
    uint8_t *sbuf;
    unsigned scount;
    uint64_t rng;                       /* xorshift64*: the RTCP intervals */
    int own_gcm;                        /* srtp="openssl": GCM profiles on srtp_gcm.c */
    int opus_application, opus_bitrate, opus_complexity;   /* pcm16 sessions' encoders */
} Plane;

static int srtp_ready = 0;

static inline uint64_t key_of(const uint8_t *p6) { /* bytes: port (2), IPv4 (4) */
    uint64_t k = 0;
    memcpy(&k, p6, 6);
    return k;
}

static inline uint64_t key_of_sockaddr(const struct sockaddr_in *a) {
    return key_of((const uint8_t *)&a->sin_port);  /* sin_port then sin_addr, network order */
}

static inline unsigned hash_key(uint64_t k, unsigned size) {
    k ^= k >> 29; k *= 0xbf58476d1ce4e5b9ull; k ^= k >> 32;
    return (unsigned)(k & (size - 1));
}

static inline int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static inline double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* When the kernel received a datagram (SO_TIMESTAMPNS, set on every socket the plane reads),
 * or ``otherwise``: a read later than the arrival (a busy event loop) does not move it. */
static double kernel_time(struct msghdr *m, double otherwise) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS &&
            c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof ts);
            double at = (double)ts.tv_sec + ts.tv_nsec / 1e9;
            return at > 0 && at <= otherwise ? at : otherwise;
        }
    }
    return otherwise;
}

static void stamp_arrivals(int fd) {
    int on = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);  /* best effort */
}

static Session *find(Plane *p, uint64_t key) {
    unsigned i = hash_key(key, p->table_size);
    for (unsigned n = 0; n < p->table_size; n++, i = (i + 1) & (p->table_size - 1)) {
        int32_t s = p->table[i];
        if (s == -1) return NULL;
        if (s >= 0 && p->sessions[s].key == key) return &p->sessions[s];
    }
    return NULL;
}

/* A channel argument: an int of 32 bits (a larger one would alias a smaller channel). */
static int channel_arg(PyObject *arg, uint32_t *out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return -1;
    if (v > 0xFFFFFFFFull) {
        PyErr_SetString(PyExc_OverflowError, "a channel is a 32-bit number");
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static Session *by_channel(Plane *p, uint32_t channel) {
    /* channels are the sessions' slot numbers plus one generation per reuse: slot in the
     * low 16 bits */
    uint32_t slot = channel & 0xFFFF;
    if (slot >= p->capacity) return NULL;
    Session *s = &p->sessions[slot];
    return s->used && s->channel == channel ? s : NULL;
}

static void table_insert(Plane *p, unsigned slot) {
    unsigned i = hash_key(p->sessions[slot].key, p->table_size);
    while (p->table[i] >= 0) i = (i + 1) & (p->table_size - 1);
    if (p->table[i] == -2) p->tombstones--;
    p->table[i] = (int32_t)slot;
}

static void table_remove(Plane *p, uint64_t key) {
    unsigned i = hash_key(key, p->table_size);
    for (unsigned n = 0; n < p->table_size; n++, i = (i + 1) & (p->table_size - 1)) {
        int32_t s = p->table[i];
        if (s == -1) break;
        if (s >= 0 && p->sessions[s].key == key) { p->table[i] = -2; p->tombstones++; break; }
    }
    /* a miss walks to an empty entry: rebuild before tombstones make that long */
    if (p->tombstones > p->table_size / 4) {
        for (unsigned j = 0; j < p->table_size; j++) p->table[j] = -1;
        p->tombstones = 0;
        for (unsigned slot = 0; slot < p->capacity; slot++)
            if (p->sessions[slot].used && p->sessions[slot].fd < 0 &&
                p->sessions[slot].key != key)
                table_insert(p, slot);   /* sessions with their own socket are never in it */
    }
}

/* Queue a frame; at ``limit`` frames the oldest goes (bounded latency). */
static void ring_push(Ring *r, const uint8_t *data, unsigned len, unsigned limit, int *dropped) {
    *dropped = 0;
    if (r->count >= limit) {
        r->head = (r->head + 1) % RING;
        r->count--;
        *dropped = 1;
    }
    Frame *f = &r->frames[(r->head + r->count) % RING];
    memcpy(f->data, data, len);
    f->len = (uint16_t)len;
    r->count++;
}

static Frame *ring_pop(Ring *r) {
    if (!r->count) return NULL;
    Frame *f = &r->frames[r->head];
    r->head = (r->head + 1) % RING;
    r->count--;
    return f;
}

static inline uint32_t be32(const uint8_t *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static inline void put16(uint8_t *b, uint16_t v) { b[0] = (uint8_t)(v >> 8); b[1] = (uint8_t)v; }

static inline void put32(uint8_t *b, uint32_t v) {
    b[0] = (uint8_t)(v >> 24); b[1] = (uint8_t)(v >> 16); b[2] = (uint8_t)(v >> 8); b[3] = (uint8_t)v;
}

static uint64_t ntp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t sec = (uint64_t)ts.tv_sec + 2208988800ull;
    uint64_t frac = ((uint64_t)ts.tv_nsec << 32) / 1000000000ull;
    return sec << 32 | frac;
}

/* The next report's time: 0.5-1.5 s on, uniformly, as aiortc spaces its reports. */
static int64_t next_report_ns(Plane *p, int64_t now) {
    p->rng ^= p->rng >> 12; p->rng ^= p->rng << 25; p->rng ^= p->rng >> 27;
    uint64_t r = (p->rng * 0x2545F4914F6CDD1Dull) >> 11;          /* 53 bits */
    return now + 500000000ll + (int64_t)(r % 1000000000ull);
}

/* ------------------------------------------------------------------ receive */

static void stats_add(Session *s, uint16_t seq, uint32_t ts, uint32_t ssrc, double at) {
    if (s->have_ssrc && ssrc != s->rx_ssrc) {   /* a new stream: its statistics start over */
        s->have_ssrc = 0;
        s->packets_received = 0;
        s->cycles = 0;
        s->jitter_q4 = 0;
        s->expected_prior = s->received_prior = 0;
        s->sr_lsr = 0;
    }
    int first = !s->have_ssrc;
    int in_order = first || ((uint16_t)(seq - s->max_seq) < 0x8000u && seq != s->max_seq);
    s->packets_received++;
    if (first) {
        s->have_ssrc = 1;
        s->rx_ssrc = ssrc;
        s->base_seq = seq;
    }
    if (in_order) {
        int64_t arrival = (int64_t)(at * 48000.0);   /* in the clock rate's units */
        if (!first && seq < s->max_seq) s->cycles += 1u << 16;
        s->max_seq = seq;
        if (!first && ts != s->last_ts && s->packets_received > 1) {
            int64_t d = (arrival - s->last_arrival) - (int64_t)(int32_t)(ts - s->last_ts);
            if (d < 0) d = -d;
            s->jitter_q4 += d - ((s->jitter_q4 + 8) >> 4);
        }
        s->last_arrival = arrival;
        s->last_ts = ts;
    }
}

static void note_arrival(Session *s, double at) {
    int64_t now = mono_ns();
    s->last_wall = at;
    if (!s->first_wall) s->first_wall = s->last_wall;
    if (s->last_ns && now - s->last_ns >= GAP_NS) {
        if (s->ngaps < GAPS) {
            double seconds = (now - s->last_ns) / 1e9;
            s->gaps[s->ngaps][0] = wall_s() - seconds;
            s->gaps[s->ngaps][1] = seconds;
            s->ngaps++;
        } else {
            s->gaps_lost++;
        }
    }
    s->last_ns = now;
}

static int known_ssrc(const Session *s, uint32_t ssrc) {
    for (unsigned k = 0; k < s->nssrcs; k++)
        if (s->ssrcs[k] == ssrc) return 1;
    return 0;
}

/* Unprotect an SRTP (rtcp 0) or SRTCP packet of ``s`` in place: 1 when it authenticated (its
 * SSRC is then one of the session's: libsrtp keeps a stream for it), 0 when it was dropped,
 * counted by reason. */
static int unprotect(Plane *p, Session *s, uint8_t *pkt, int *len, int rtcp) {
    uint32_t ssrc = be32(pkt + (rtcp ? 4 : 8));
    int known = known_ssrc(s, ssrc);
    if (!known && s->nssrcs == SSRCS) { p->counters[C_DROP_SSRC_LIMIT]++; return 0; }
    int reason = 0;   /* auth, replay, other: in this order in both families of counters */
    if (s->grx) {
        int e = rtcp ? gcm_unprotect_rtcp(s->grx, pkt, len) : gcm_unprotect_rtp(s->grx, pkt, len);
        reason = e - GCM_AUTH + 1;
    } else {
        srtp_err_status_t e = rtcp ? srtp_unprotect_rtcp(s->rx, pkt, len)
                                   : srtp_unprotect(s->rx, pkt, len);
        if (e != srtp_err_status_ok)
            reason = e == srtp_err_status_auth_fail ? 1
                   : e == srtp_err_status_replay_fail || e == srtp_err_status_replay_old ? 2 : 3;
    }
    if (reason) {
        p->counters[(rtcp ? C_DROP_RTCP_AUTH : C_DROP_SRTP_AUTH) + reason - 1]++;
        return 0;
    }
    if (!known) s->ssrcs[s->nssrcs++] = ssrc;
    return 1;
}

/* A report block (RFC 3550 6.4.1) about our stream: what the peer saw, and the RTT. */
static void report_block(Session *s, const uint8_t *b) {
    if (be32(b) != s->ssrc) return;
    s->remote_report = 1;
    s->remote_fraction = b[4];
    int32_t lost = (int32_t)((uint32_t)b[5] << 16 | (uint32_t)b[6] << 8 | b[7]);
    s->remote_lost = lost & 0x800000 ? lost - 0x1000000 : lost;
    s->remote_highest = be32(b + 8);
    s->remote_jitter = be32(b + 12);
    uint32_t lsr = be32(b + 16), dlsr = be32(b + 20);
    int ours = 0;
    for (unsigned k = 0; k < LSRS && k < s->nlsr; k++) ours |= lsr && s->our_lsr[k] == lsr;
    if (!ours) return;   /* no SR of ours yet, or one too old to be sure of */
    uint32_t rtt = (uint32_t)(ntp_now() >> 16) - lsr - dlsr;   /* 1/65536 s, mod 2^32 */
    if (rtt >= 0x80000000u) return;   /* negative: the peer's DLSR is more than it waited */
    s->rtt_last_s = rtt / 65536.0;
    s->rtt_s = s->rtt_samples ? RTT_ALPHA * s->rtt_s + (1 - RTT_ALPHA) * s->rtt_last_s
                              : s->rtt_last_s;
    s->rtt_samples++;
}

/* An SRTCP datagram of a session whose RTCP the plane keeps: taken (1) whatever it holds. */
static int handle_rtcp(Plane *p, Session *s, uint8_t *pkt, int plen, int len, int relayed,
                       const struct sockaddr_in *src) {
    if (plen < 8) { p->counters[C_DROP_RTCP_MALFORMED]++; return 1; }
    int clear = plen;
    if (!unprotect(p, s, pkt, &clear, 1)) return 1;
    if (relayed) s->relay = *src;
    p->counters[C_RTCP_IN]++;
    p->counters[C_BYTES_IN] += (uint64_t)len;
    s->rtcp_in++;
    int64_t now = mono_ns();
    /* a compound packet: each part's header says its length; a bad one ends the walk (the
     * datagram was taken: rtcp_bad_part says what of it was not read) */
    for (int off = 0; off + 4 <= clear;) {
        const uint8_t *h = pkt + off;
        unsigned count = h[0] & 0x1F, type = h[1];
        int blen = 4 * (((int)h[2] << 8 | h[3]) + 1);
        if ((h[0] >> 6) != 2 || off + blen > clear) { p->counters[C_RTCP_BAD_PART]++; break; }
        if (type == 200 || type == 201) {              /* SR, RR */
            int first = type == 200 ? 28 : 8;
            if (blen < first + 24 * (int)count) { p->counters[C_RTCP_BAD_PART]++; break; }
            if (type == 200 && (!s->have_ssrc || be32(h + 4) == s->rx_ssrc)) {
                s->sr_lsr = be32(h + 10);              /* NTP's middle 32 bits */
                s->sr_at_ns = now;
            }
            for (unsigned k = 0; k < count; k++) report_block(s, h + first + 24 * k);
        } else if (type == 203) {                       /* BYE */
            s->bye = 1;
            p->counters[C_RTCP_BYE]++;
        }                                               /* SDES, APP, feedback: read past */
        off += blen;
    }
    return 1;
}

/* A keeping client's payload into its heard log; a full log drops it (heard_lost). */
static void keep_heard(Plane *p, Session *s, uint16_t seq, uint32_t ts, const uint8_t *data,
                       int len) {
    if (len > OPUS_MAX || s->heard_len + HEARD_HEAD + (unsigned)len > HEARD_BYTES) {
        p->counters[C_HEARD_LOST]++;
        return;
    }
    uint8_t *r = s->heard + s->heard_len;
    uint16_t size = (uint16_t)len;
    memcpy(r, &s->last_wall, 8);   /* note_arrival's clock reading of this packet */
    memcpy(r + 8, &seq, 2);
    memcpy(r + 10, &ts, 4);
    memcpy(r + 14, &size, 2);
    memcpy(r + HEARD_HEAD, data, (size_t)len);
    s->heard_len += HEARD_HEAD + (unsigned)len;
}

/* One datagram (data may be modified in place, it is ours). Returns 1 when the plane took it
 * (delivered or dropped), 0 when it goes to Python. */
static int handle(Plane *p, uint8_t *data, int len, const struct sockaddr_in *src,
                  Session *own) {
    uint8_t *pkt = data;
    int plen = len;
    uint64_t key;
    int relayed = 0;
    if (own && own->turn_channel) {
        /* ChannelData of the session's channel, from its TURN server; anything else is the
         * allocation's business (Python's) */
        if (plen < CHANNEL_LEN || (unsigned)(pkt[0] << 8 | pkt[1]) != own->turn_channel)
            return 0;
        int inner = pkt[2] << 8 | pkt[3];
        if (inner > plen - CHANNEL_LEN) return 0;
        if (key_of_sockaddr(src) != own->key) { p->counters[C_WRONG_PEER]++; return 0; }
        pkt += CHANNEL_LEN;
        plen = inner;
        key = own->key;
    } else if (plen >= 1 && pkt[0] == HOP_MAGIC) {
        if (plen < HOP_V4_LEN || pkt[1] != 0x00) return 0;   /* IPv6, towards the client, bad */
        key = key_of(pkt + 2);
        pkt += HOP_V4_LEN;
        plen -= HOP_V4_LEN;
        relayed = 1;
    } else {
        key = key_of_sockaddr(src);
    }
    if (plen < 2 || pkt[0] < 128 || pkt[0] > 191) return 0;
    int is_rtcp = pkt[1] >= 192 && pkt[1] <= 223;
    if (is_rtcp && own && !own->rtcp) return 0;
    Session *s = own ? own : find(p, key);
    if (own && (relayed || own->key != key)) { p->counters[C_WRONG_PEER]++; return 0; }
    if (!s || s->relayed != relayed) return 0;
    if (is_rtcp) return s->rtcp ? handle_rtcp(p, s, pkt, plen, len, relayed, src) : 0;
    if (plen < 12) { p->counters[C_DROP_RTP_MALFORMED]++; return 1; }
    int clear = plen;
    if (!unprotect(p, s, pkt, &clear, 0)) return 1;
    /* RTP header: version 2, CSRCs, extension, padding */
    if (clear < 12 || (pkt[0] >> 6) != 2) { p->counters[C_DROP_RTP_MALFORMED]++; return 1; }
    int off = 12 + 4 * (pkt[0] & 0x0F);
    if (pkt[0] & 0x10) {
        if (off + 4 > clear) { p->counters[C_DROP_RTP_MALFORMED]++; return 1; }
        off += 4 + 4 * ((pkt[off + 2] << 8) | pkt[off + 3]);
    }
    int end = clear;
    if (pkt[0] & 0x20) {
        /* the count includes itself (RFC 3550 5.1): 0 is malformed */
        if (end <= off || pkt[end - 1] == 0) { p->counters[C_DROP_RTP_MALFORMED]++; return 1; }
        end -= pkt[end - 1];
    }
    if (off > end) { p->counters[C_DROP_RTP_MALFORMED]++; return 1; }
    uint16_t seq = (uint16_t)(pkt[2] << 8 | pkt[3]);
    uint32_t ts = (uint32_t)pkt[4] << 24 | pkt[5] << 16 | pkt[6] << 8 | pkt[7];
    uint32_t ssrc = (uint32_t)pkt[8] << 24 | pkt[9] << 16 | pkt[10] << 8 | pkt[11];
    if (s->have_ssrc && ssrc != s->rx_ssrc) p->counters[C_SSRC_CHANGES]++;
    stats_add(s, seq, ts, ssrc, p->rx_wall);
    note_arrival(s, p->rx_wall);
    if (s->arrivals) {
        if (s->narrivals < ARRIVALS) {
            Arrival *a = &s->arrivals[s->narrivals++];
            double waited = wall_s() - p->rx_wall;   /* since the kernel had it */
            a->at = mono_ns() / 1e9 - (waited > 0 ? waited : 0);
            a->ssrc = ssrc;
            a->seq = seq;
            a->size = (uint16_t)(end - off);
        } else {
            p->counters[C_ARRIVALS_LOST]++;
        }
    }
    if (relayed) s->relay = *src;   /* answers follow the relay that last delivered the client */
    p->counters[C_RTP_IN]++;
    p->counters[C_BYTES_IN] += (uint64_t)len;
    int payload = end - off;
    int dropped;
    if (s->script) {   /* a client keeps nothing of what it hears, or logs it for its ear */
        if (s->heard && payload > 0) keep_heard(p, s, seq, ts, pkt + off, payload);
        return 1;
    }
    if (payload == 0) return 1;
    if (s->pcm) {
        opus_int16 pcm[PCM_SAMPLES];
        int n = opus_decode(s->dec, pkt + off, payload, pcm, PCM_SAMPLES, 0);
        if (n != PCM_SAMPLES) { p->counters[C_DROP_DECODE]++; return 1; }
        ring_push(&s->in, (const uint8_t *)pcm, PCM_SAMPLES * 2, RING, &dropped);
    } else {
        if (payload > FRAME_MAX) { p->counters[C_DROP_FRAME_TOO_BIG]++; return 1; }
        ring_push(&s->in, pkt + off, (unsigned)payload, RING, &dropped);
    }
    if (dropped) p->counters[C_DROP_IN_QUEUE_FULL]++;
    return 1;
}

static PyObject *to_python(const uint8_t *data, int len, const struct sockaddr_in *src) {
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &src->sin_addr, host, sizeof host);
    return Py_BuildValue("(y#(si))", data, (Py_ssize_t)len, host, (int)ntohs(src->sin_port));
}

/* ------------------------------------------------------------------ send */

static int flush(Plane *p) {
    unsigned done = 0;
    while (done < p->scount) {
        int n = sendmmsg(p->fd, p->smsgs + done, p->scount - done, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            p->counters[C_SEND_ERRORS] += p->scount - done;  /* buffer full: UDP drops them */
            break;
        }
        done += (unsigned)n;
    }
    p->scount = 0;
    return 0;
}

/* A datagram built in the next send slot: queued for sendmmsg, or sent at once on a
 * session's own socket (as any client sends). */
static int emit(Plane *p, Session *s, uint8_t *out, size_t len) {
    if (s->fd >= 0) {
        if (sendto(s->fd, out, len, MSG_DONTWAIT, (struct sockaddr *)&s->client,
                   sizeof s->client) < 0) {
            p->counters[C_SEND_ERRORS]++;
            return -1;
        }
        return 0;
    }
    unsigned i = p->scount++;
    p->siov[i].iov_base = out;
    p->siov[i].iov_len = len;
    p->smsgs[i].msg_hdr.msg_name = s->relayed ? &s->relay : &s->client;
    p->smsgs[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
    return 0;
}

/* What goes before a protected packet: the relay's hop header towards the client, or a TURN
 * ChannelData header. */
static unsigned header_len(const Session *s) {
    return s->relayed ? HOP_V4_LEN : s->turn_channel ? CHANNEL_LEN : 0;
}

static void put_header(const Session *s, uint8_t *out, int len) {
    if (s->relayed) {
        memcpy(out, s->hop, HOP_V4_LEN);
    } else if (s->turn_channel) {
        out[0] = (uint8_t)(s->turn_channel >> 8);
        out[1] = (uint8_t)s->turn_channel;
        out[2] = (uint8_t)(len >> 8);
        out[3] = (uint8_t)len;
    }
}

static void send_frame(Plane *p, Session *s, const uint8_t *payload, unsigned plen) {
    if (p->scount == BATCH) flush(p);
    unsigned i = p->scount;
    uint8_t *out = p->sbuf + (size_t)i * SLOT_BYTES;
    unsigned hlen = header_len(s);
    uint8_t *rtp = out + hlen;
    uint64_t ntp = ntp_now();
    rtp[0] = 0x80;
    int ext_words = 0;
    uint8_t ext[24];
    unsigned elen = 0;
    if (s->mid_id && s->mid_len) {
        ext[elen++] = (uint8_t)(s->mid_id << 4 | (s->mid_len - 1));
        memcpy(ext + elen, s->mid, s->mid_len);
        elen += s->mid_len;
    }
    if (s->ast_id) {
        uint32_t ast = (uint32_t)(ntp >> 14) & 0x00FFFFFF;
        ext[elen++] = (uint8_t)(s->ast_id << 4 | 2);
        ext[elen++] = (uint8_t)(ast >> 16);
        ext[elen++] = (uint8_t)(ast >> 8);
        ext[elen++] = (uint8_t)ast;
    }
    while (elen % 4) ext[elen++] = 0;
    if (elen) { rtp[0] |= 0x10; ext_words = (int)elen / 4; }
    rtp[1] = (uint8_t)(0x80 | s->pt);        /* marker: as aiortc marks every audio frame */
    rtp[2] = (uint8_t)(s->seq >> 8); rtp[3] = (uint8_t)s->seq;
    rtp[4] = (uint8_t)(s->timestamp >> 24); rtp[5] = (uint8_t)(s->timestamp >> 16);
    rtp[6] = (uint8_t)(s->timestamp >> 8); rtp[7] = (uint8_t)s->timestamp;
    rtp[8] = (uint8_t)(s->ssrc >> 24); rtp[9] = (uint8_t)(s->ssrc >> 16);
    rtp[10] = (uint8_t)(s->ssrc >> 8); rtp[11] = (uint8_t)s->ssrc;
    unsigned off = 12;
    if (ext_words) {
        rtp[12] = 0xBE; rtp[13] = 0xDE;
        rtp[14] = (uint8_t)(ext_words >> 8); rtp[15] = (uint8_t)ext_words;
        memcpy(rtp + 16, ext, elen);
        off = 16 + elen;
    }
    if (off + plen > RTP_MAX) { p->counters[C_DROP_FRAME_TOO_BIG]++; return; }
    memcpy(rtp + off, payload, plen);
    int len = (int)(off + plen);
    if (s->gtx ? gcm_protect_rtp(s->gtx, rtp, &len) != GCM_OK
               : srtp_protect(s->tx, rtp, &len) != srtp_err_status_ok) {
        p->counters[C_SEND_ERRORS]++;
        return;
    }
    put_header(s, out, len);
    if (emit(p, s, out, (size_t)len + hlen) < 0) return;
    s->last_ntp = ntp;
    s->last_rtp_ts = s->timestamp;
    s->packets_sent++;
    s->octets_sent += plen;
    s->seq++;
    s->timestamp += PCM_SAMPLES;
    p->counters[C_RTP_OUT]++;
    p->counters[C_BYTES_OUT] += (uint64_t)len + hlen;
}

/* Our report (RFC 3550 6.4): an SR once we have sent (an RR before), a report block on the
 * peer's stream once it has one, SDES CNAME; with ``bye``, a BYE after them. */
static void send_report(Plane *p, Session *s, int64_t now, int bye) {
    if (p->scount == BATCH) flush(p);
    uint8_t *out = p->sbuf + (size_t)p->scount * SLOT_BYTES;
    unsigned hlen = header_len(s);
    uint8_t *r = out + hlen;
    int sr = s->packets_sent > 0, blocks = s->have_ssrc;
    uint64_t ntp = ntp_now();
    r[0] = (uint8_t)(0x80 | blocks);
    r[1] = sr ? 200 : 201;
    put32(r + 4, s->ssrc);
    unsigned n = 8;
    if (sr) {
        /* this instant on both clocks: the last packet's RTP timestamp, moved on since */
        uint64_t since = ntp > s->last_ntp ? ntp - s->last_ntp : 0;
        if (since > (60ull << 32)) since = 0;
        put32(r + 8, (uint32_t)(ntp >> 32));
        put32(r + 12, (uint32_t)ntp);
        put32(r + 16, s->last_rtp_ts + (uint32_t)((since * 48000u) >> 32));
        put32(r + 20, s->packets_sent);
        put32(r + 24, s->octets_sent);
        n = 28;
        s->our_lsr[s->nlsr++ % LSRS] = (uint32_t)(ntp >> 16);
    }
    if (blocks) {   /* RFC 3550 A.3 */
        uint8_t *b = r + n;
        uint32_t ext_max = s->cycles + s->max_seq;
        uint32_t expected = ext_max - s->base_seq + 1;
        int64_t lost = (int64_t)expected - s->packets_received;
        if (lost > 0x7FFFFF) lost = 0x7FFFFF;
        if (lost < -0x800000) lost = -0x800000;
        uint32_t expected_interval = expected - s->expected_prior;
        uint32_t received_interval = s->packets_received - s->received_prior;
        s->expected_prior = expected;
        s->received_prior = s->packets_received;
        int64_t lost_interval = (int64_t)expected_interval - received_interval;
        unsigned fraction = expected_interval == 0 || lost_interval <= 0 ? 0
                          : (unsigned)((lost_interval << 8) / expected_interval);
        put32(b, s->rx_ssrc);
        put32(b + 4, (uint32_t)(lost & 0xFFFFFF));
        b[4] = (uint8_t)(fraction > 255 ? 255 : fraction);
        put32(b + 8, ext_max);
        put32(b + 12, (uint32_t)(s->jitter_q4 >> 4));
        uint32_t dlsr = 0;
        if (s->sr_lsr) {
            int64_t waited = now - s->sr_at_ns;
            dlsr = waited > 0 ? (uint32_t)(((uint64_t)waited << 16) / 1000000000ull) : 0;
        }
        put32(b + 16, s->sr_lsr);
        put32(b + 20, dlsr);
        n += 24;
    }
    put16(r + 2, (uint16_t)(n / 4 - 1));
    if (s->cname_len) {
        uint8_t *d = r + n;
        d[0] = 0x81;
        d[1] = 202;
        put32(d + 4, s->ssrc);
        d[8] = 1;                                   /* CNAME */
        d[9] = s->cname_len;
        memcpy(d + 10, s->cname, s->cname_len);
        unsigned k = 10 + s->cname_len;
        do d[k++] = 0; while (k % 4);               /* the end of the items, and padding */
        put16(d + 2, (uint16_t)(k / 4 - 1));
        n += k;
    }
    if (bye) {
        uint8_t *d = r + n;
        d[0] = 0x81;
        d[1] = 203;
        put16(d + 2, 1);
        put32(d + 4, s->ssrc);
        n += 8;
    }
    int len = (int)n;
    if (s->gtx ? gcm_protect_rtcp(s->gtx, r, &len) != GCM_OK
               : srtp_protect_rtcp(s->tx, r, &len) != srtp_err_status_ok) {
        p->counters[C_SEND_ERRORS]++;
        return;
    }
    put_header(s, out, len);
    if (emit(p, s, out, (size_t)len + hlen) < 0) return;
    s->rtcp_out++;
    p->counters[C_RTCP_OUT]++;
    p->counters[C_BYTES_OUT] += (uint64_t)len + hlen;
}

/* ------------------------------------------------------------------ the type */

/* A pcm16 session's codecs; its encoder as the plane was told (the transceiver's
 * OpusSettings, as its Python path encodes). */
static int codecs_on(Plane *p, Session *s) {
    int err;
    if (!s->dec) s->dec = opus_decoder_create(48000, 1, &err);
    if (!s->enc) {
        s->enc = opus_encoder_create(48000, 1, p->opus_application, &err);
        if (s->enc && (opus_encoder_ctl(s->enc, OPUS_SET_BITRATE(p->opus_bitrate)) != OPUS_OK ||
                       opus_encoder_ctl(s->enc, OPUS_SET_COMPLEXITY(p->opus_complexity)) != OPUS_OK)) {
            opus_encoder_destroy(s->enc);
            s->enc = NULL;
        }
    }
    return s->dec && s->enc ? 0 : -1;
}


static void session_free(Session *s) {
    if (s->rx) srtp_dealloc(s->rx);
    if (s->tx) srtp_dealloc(s->tx);
    if (s->grx) gcm_side_free(s->grx);
    if (s->gtx) gcm_side_free(s->gtx);
    PyMem_Free(s->grx);
    PyMem_Free(s->gtx);
    if (s->dec) opus_decoder_destroy(s->dec);
    if (s->enc) opus_encoder_destroy(s->enc);
    PyMem_Free(s->script);
    PyMem_Free(s->script_len);
    PyMem_Free(s->script_off);
    PyMem_Free(s->arrivals);
    PyMem_Free(s->heard);
    uint32_t channel = s->channel;
    memset(s, 0, sizeof *s);
    s->channel = channel;   /* keeps the generation for the slot's next session */
}

static void Plane_dealloc(Plane *p) {
    if (p->sessions) {
        for (unsigned i = 0; i < p->capacity; i++)
            if (p->sessions[i].used) session_free(&p->sessions[i]);
        PyMem_Free(p->sessions);
    }
    PyMem_Free(p->table);
    PyMem_Free(p->order);
    PyMem_Free(p->rbuf);
    PyMem_Free(p->sbuf);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int Plane_init(Plane *p, PyObject *args, PyObject *kw) {
    static char *names[] = {"fd", "capacity", "srtp", "opus_application", "opus_bitrate",
                            "opus_complexity", NULL};
    int fd;
    unsigned capacity = 1024;
    const char *srtp = "openssl";
    /* libopus's voip default, unless told (the transceiver tells it its OpusSettings) */
    int application = OPUS_APPLICATION_VOIP, bitrate = OPUS_AUTO, complexity = 10;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|Isiii", names, &fd, &capacity, &srtp,
                                     &application, &bitrate, &complexity))
        return -1;
    if (strcmp(srtp, "openssl") && strcmp(srtp, "libsrtp")) {
        PyErr_SetString(PyExc_ValueError, "srtp must be 'openssl' or 'libsrtp'");
        return -1;
    }
    if ((application != OPUS_APPLICATION_VOIP && application != OPUS_APPLICATION_AUDIO &&
         application != OPUS_APPLICATION_RESTRICTED_LOWDELAY) || complexity < 0 ||
        complexity > 10 || (bitrate != OPUS_AUTO && (bitrate < 500 || bitrate > 512000))) {
        PyErr_SetString(PyExc_ValueError, "bad Opus encoder settings");
        return -1;
    }
    if (p->sessions) {
        PyErr_SetString(PyExc_RuntimeError, "a plane is initialised once");
        return -1;
    }
    if (capacity < 1 || capacity > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "capacity must be 1..65535");
        return -1;
    }
    if (!srtp_ready) {
        if (srtp_init() != srtp_err_status_ok) {
            PyErr_SetString(PyExc_RuntimeError, "srtp_init failed");
            return -1;
        }
        srtp_ready = 1;
    }
    p->fd = fd;
    stamp_arrivals(fd);
    p->capacity = capacity;
    p->own_gcm = !strcmp(srtp, "openssl");
    p->opus_application = application;
    p->opus_bitrate = bitrate;
    p->opus_complexity = complexity;
    p->rng = (uint64_t)mono_ns() ^ (uint64_t)(uintptr_t)p ^ 0x9E3779B97F4A7C15ull;
    p->table_size = 1;
    while (p->table_size < capacity * 2) p->table_size <<= 1;
    p->sessions = PyMem_Calloc(capacity, sizeof(Session));
    p->table = PyMem_Malloc(p->table_size * sizeof(int32_t));
    p->order = PyMem_Malloc(capacity * sizeof(uint16_t));
    p->rbuf = PyMem_Malloc((size_t)BATCH * SLOT_BYTES);
    p->sbuf = PyMem_Malloc((size_t)BATCH * SLOT_BYTES);
    if (!p->sessions || !p->table || !p->order || !p->rbuf || !p->sbuf) {
        PyErr_NoMemory();
        return -1;
    }
    for (unsigned i = 0; i < p->table_size; i++) p->table[i] = -1;
    for (unsigned i = 0; i < capacity; i++) p->sessions[i].channel = i;
    for (int i = 0; i < BATCH; i++) {
        p->riov[i].iov_base = p->rbuf + (size_t)i * SLOT_BYTES;
        p->riov[i].iov_len = SLOT_BYTES;
        p->rmsgs[i].msg_hdr.msg_iov = &p->riov[i];
        p->rmsgs[i].msg_hdr.msg_iovlen = 1;
        p->smsgs[i].msg_hdr.msg_iov = &p->siov[i];
        p->smsgs[i].msg_hdr.msg_iovlen = 1;
    }
    return 0;
}

static int parse_v4(PyObject *addr, struct sockaddr_in *out) {
    const char *host;
    int port;
    if (!PyArg_ParseTuple(addr, "si", &host, &port)) return -1;
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    if (port < 0 || port > 65535 || inet_pton(AF_INET, host, &out->sin_addr) != 1) {
        PyErr_SetString(PyExc_ValueError, "an IPv4 (host, port) is needed");
        return -1;
    }
    out->sin_port = htons((uint16_t)port);
    return 0;
}

static PyObject *Plane_add(Plane *p, PyObject *args, PyObject *kw) {
    static char *names[] = {"client", "relay", "profile", "rx_key", "tx_key", "ssrc", "seq",
                            "timestamp", "payload_type", "mid", "mid_id", "abs_send_time_id",
                            "silence", "pcm", "fd", "script", "rtcp", "cname", "turn_channel",
                            "keep", "group", NULL};
    PyObject *client, *relay;
    int profile, pt, mid_id, ast_id, pcm = 0, fd = -1, rtcp = 0, turn_channel = 0, keep = 0;
    int group = 0;
    Py_buffer script = {0}, cname = {0};
    unsigned int ssrc, seq, timestamp;
    Py_buffer rx_key, tx_key, mid, silence;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOiy*y*IIIiy*iiy*|piy*py*ipi", names,
                                     &client, &relay, &profile, &rx_key, &tx_key, &ssrc, &seq,
                                     &timestamp, &pt, &mid, &mid_id, &ast_id, &silence, &pcm, &fd,
                                     &script, &rtcp, &cname, &turn_channel, &keep, &group))
        return NULL;
    PyObject *result = NULL;
    struct sockaddr_in caddr, raddr;
    memset(&raddr, 0, sizeof raddr);
    if (parse_v4(client, &caddr) < 0) goto done;
    if (relay != Py_None && parse_v4(relay, &raddr) < 0) goto done;
    /* payload types 64-95 read as RTCP's packet types on a muxed port (RFC 5761 4) */
    if (mid.len > 16 || silence.len > 64 || (cname.buf && cname.len > 63) || pt < 0 || pt > 127 ||
        (pt >= 64 && pt <= 95) || mid_id < 0 || mid_id > 14 ||
        ast_id < 0 || ast_id > 14 || seq > 0xFFFF || group < 0 || group > 255) {
        PyErr_SetString(PyExc_ValueError, "bad RTP parameters");
        goto done;
    }
    uint64_t key = key_of_sockaddr(&caddr);
    if (fd >= 0 && relay != Py_None) {
        PyErr_SetString(PyExc_ValueError, "a session with its own socket is not relayed");
        goto done;
    }
    if (turn_channel && (fd < 0 || turn_channel < CHANNEL_MIN || turn_channel > CHANNEL_MAX)) {
        PyErr_SetString(PyExc_ValueError,
                        "a TURN channel is 0x4000-0x4FFF, on a session's own socket");
        goto done;
    }
    if (keep && (fd < 0 || !script.buf || pcm)) {
        PyErr_SetString(PyExc_ValueError, "keep is a client session's (fd and script, not pcm)");
        goto done;
    }
    if (fd < 0 && find(p, key)) { PyErr_SetString(PyExc_ValueError, "that client address has a session"); goto done; }
    if (p->live >= p->capacity) { PyErr_SetString(PyExc_OverflowError, "the plane is full"); goto done; }
    unsigned slot = 0;
    while (p->sessions[slot].used) slot++;
    Session *s = &p->sessions[slot];
    srtp_policy_t policy;
    memset(&policy, 0, sizeof policy);
    if (srtp_crypto_policy_set_from_profile_for_rtp(&policy.rtp, profile) ||
        srtp_crypto_policy_set_from_profile_for_rtcp(&policy.rtcp, profile)) {
        PyErr_SetString(PyExc_ValueError, "unsupported SRTP profile");
        goto done;
    }
    int need = srtp_profile_get_master_key_length(profile) +
               srtp_profile_get_master_salt_length(profile);
    if (rx_key.len != need || tx_key.len != need) {
        PyErr_Format(PyExc_ValueError, "SRTP keys must be %d bytes (key and salt)", need);
        goto done;
    }
    int gcm_key_len;
    if (p->own_gcm && gcm_profile(profile, &gcm_key_len)) {
        s->grx = PyMem_Malloc(sizeof(GcmSide));
        s->gtx = PyMem_Malloc(sizeof(GcmSide));
        if (!s->grx || !s->gtx) {
            PyMem_Free(s->grx);
            PyMem_Free(s->gtx);
            s->grx = s->gtx = NULL;
            PyErr_NoMemory();
            goto done;
        }
        int rx_ok = gcm_side_init(s->grx, gcm_key_len, rx_key.buf, 0) == 0;
        int tx_ok = gcm_side_init(s->gtx, gcm_key_len, tx_key.buf, 1) == 0;
        if (!rx_ok || !tx_ok) {
            session_free(s);
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL's AES-GCM could not be keyed");
            goto done;
        }
    } else {
        policy.window_size = GCM_RTP_WINDOW;   /* the same window on both implementations */
        policy.allow_repeat_tx = 1;
        policy.ssrc.type = ssrc_any_inbound;
        policy.key = rx_key.buf;
        if (srtp_create(&s->rx, &policy) != srtp_err_status_ok) {
            PyErr_SetString(PyExc_ValueError, "srtp_create (inbound) failed");
            s->rx = NULL;
            goto done;
        }
        policy.ssrc.type = ssrc_any_outbound;
        policy.key = tx_key.buf;
        if (srtp_create(&s->tx, &policy) != srtp_err_status_ok) {
            PyErr_SetString(PyExc_ValueError, "srtp_create (outbound) failed");
            s->tx = NULL;
            session_free(s);
            goto done;
        }
    }
    if (pcm) {
        if (codecs_on(p, s) < 0) {
            session_free(s);
            PyErr_SetString(PyExc_RuntimeError, "opus codec creation failed");
            goto done;
        }
        s->pcm = 1;
        s->coded_silence = CODED_SILENCE;  /* nothing played yet: no sound to end */
    }
    s->fd = fd;
    stamp_arrivals(fd);
    s->turn_channel = (uint16_t)turn_channel;
    if (fd >= 0 && script.buf) {
        /* a client session's script: records [u32 ignored][u16 length][payload], as take_batch packs them */
        const uint8_t *r = script.buf;
        Py_ssize_t left = script.buf ? script.len : 0;
        unsigned n = 0;
        for (Py_ssize_t off = 0; off + 6 <= left;) {
            unsigned len = (unsigned)(r[off + 4] << 8 | r[off + 5]);
            if (off + 6 + (Py_ssize_t)len > left || len == 0 || len > 1275) break;
            off += 6 + len;
            n++;
        }
        s->arrivals = PyMem_Malloc(ARRIVALS * sizeof(Arrival));
        s->script = PyMem_Malloc(left ? (size_t)left : 1);
        s->script_len = PyMem_Malloc((n ? n : 1) * sizeof(uint16_t));
        s->script_off = PyMem_Malloc((n ? n : 1) * sizeof(uint32_t));
        if (!s->arrivals || !s->script || !s->script_len || !s->script_off) {
            session_free(s);
            PyErr_NoMemory();
            goto done;
        }
        Py_ssize_t off = 0, w = 0;
        for (unsigned k = 0; k < n; k++) {
            unsigned len = (unsigned)(r[off + 4] << 8 | r[off + 5]);
            memcpy(s->script + w, r + off + 6, len);
            s->script_off[k] = (uint32_t)w;
            s->script_len[k] = (uint16_t)len;
            w += len;
            off += 6 + len;
        }
        s->script_n = n;
        if (keep) {
            int err;
            s->heard = PyMem_Malloc(HEARD_BYTES);
            s->dec = opus_decoder_create(48000, 1, &err);
            if (!s->heard || !s->dec) {
                session_free(s);
                PyErr_SetString(PyExc_RuntimeError, "no memory or no Opus decoder for keep");
                goto done;
            }
        }
    }
    s->used = 1;
    s->channel = (s->channel & 0xFFFF0000u) + 0x10000u + slot;  /* a new generation */
    s->key = key;
    s->client = caddr;
    s->relayed = relay != Py_None;
    s->relay = raddr;
    s->hop[0] = HOP_MAGIC;
    s->hop[1] = 0x01;   /* towards the client, IPv4 */
    memcpy(s->hop + 2, &caddr.sin_port, 2);
    memcpy(s->hop + 4, &caddr.sin_addr, 4);
    s->ssrc = ssrc;
    s->seq = (uint16_t)seq;
    s->timestamp = timestamp;
    s->pt = (uint8_t)pt;
    s->mid_id = (uint8_t)mid_id;
    s->ast_id = (uint8_t)ast_id;
    s->mid_len = (uint8_t)mid.len;
    memcpy(s->mid, mid.buf, mid.len);
    s->silence_len = (uint16_t)silence.len;
    memcpy(s->silence, silence.buf, silence.len);
    s->rtcp = rtcp;
    s->group = (uint8_t)group;
    if (cname.buf) {
        s->cname_len = (uint8_t)cname.len;
        memcpy(s->cname, cname.buf, cname.len);
    }
    s->next_rtcp_ns = next_report_ns(p, mono_ns());
    if (fd < 0) table_insert(p, slot);   /* own sockets are read by channel, not looked up */
    s->order_pos = p->live;
    p->order[p->live++] = (uint16_t)slot;
    result = PyLong_FromUnsignedLong(s->channel);
done:
    PyBuffer_Release(&rx_key);
    PyBuffer_Release(&tx_key);
    PyBuffer_Release(&mid);
    PyBuffer_Release(&silence);
    if (script.buf) PyBuffer_Release(&script);
    if (cname.buf) PyBuffer_Release(&cname);
    return result;
}

static PyObject *Plane_set_pcm(Plane *p, PyObject *args) {
    PyObject *arg;
    uint32_t channel;
    int pcm;
    if (!PyArg_ParseTuple(args, "Op", &arg, &pcm) || channel_arg(arg, &channel) < 0) return NULL;
    Session *s = by_channel(p, (uint32_t)channel);
    if (!s) Py_RETURN_FALSE;
    if (pcm && codecs_on(p, s) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "opus codec creation failed");
        return NULL;
    }
    s->pcm = pcm;
    s->coded_silence = CODED_SILENCE;
    s->in.count = s->out.count = 0;   /* what is queued is in the other codec */
    Py_RETURN_TRUE;
}

/* The agent's frames queued towards a session's client go unsent (a barge-in cut the reply). */
static PyObject *Plane_clear(Plane *p, PyObject *arg) {
    uint32_t channel;
    if (channel_arg(arg, &channel) < 0) return NULL;
    Session *s = by_channel(p, channel);
    if (!s) return PyLong_FromLong(0);
    unsigned cleared = s->out.count;
    s->out.count = 0;
    return PyLong_FromUnsignedLong(cleared);
}

/* A session's client moved (ICE nominated a pair to a new address: a NAT rebinding, a
 * handover): its datagrams are taken from, and sent to, the new address (through ``relay``
 * for a relayed one); the keys, the streams and their counters stay. */
static PyObject *Plane_move(Plane *p, PyObject *args) {
    PyObject *arg, *client, *relay;
    uint32_t channel;
    if (!PyArg_ParseTuple(args, "OOO", &arg, &client, &relay) || channel_arg(arg, &channel) < 0)
        return NULL;
    struct sockaddr_in caddr, raddr;
    memset(&raddr, 0, sizeof raddr);
    if (parse_v4(client, &caddr) < 0) return NULL;
    if (relay != Py_None && parse_v4(relay, &raddr) < 0) return NULL;
    Session *s = by_channel(p, channel);
    if (!s) Py_RETURN_FALSE;
    if (s->fd >= 0 && (relay != Py_None || s->turn_channel)) {
        PyErr_SetString(PyExc_ValueError, s->turn_channel
                        ? "a session through a TURN channel moves with its TURN server"
                        : "a session with its own socket is not relayed");
        return NULL;
    }
    uint64_t key = key_of_sockaddr(&caddr);
    if (s->fd < 0 && key != s->key) {
        if (find(p, key)) {
            PyErr_SetString(PyExc_ValueError, "that client address has a session");
            return NULL;
        }
        table_remove(p, s->key);   /* (a rebuild it triggers leaves this session out) */
        s->key = key;
        table_insert(p, (unsigned)(s - p->sessions));
    }
    s->key = key;
    s->client = caddr;
    s->relayed = relay != Py_None;
    s->relay = raddr;
    memcpy(s->hop + 2, &caddr.sin_port, 2);
    memcpy(s->hop + 4, &caddr.sin_addr, 4);
    Py_RETURN_TRUE;
}

/* (channel, bye=False) arguments: the session, or NULL with *bad set on an argument error. */
static Session *channel_and_bye(Plane *p, PyObject *args, int *bye, int *bad) {
    PyObject *arg;
    uint32_t channel;
    *bye = 0;
    *bad = !PyArg_ParseTuple(args, "O|p", &arg, bye) || channel_arg(arg, &channel) < 0;
    return *bad ? NULL : by_channel(p, channel);
}

/* A report sent now (flushed), the next one rescheduled from now. */
static void report_now(Plane *p, Session *s, int bye) {
    int64_t now = mono_ns();
    send_report(p, s, now, bye);
    flush(p);
    s->next_rtcp_ns = next_report_ns(p, now);
}

static PyObject *Plane_report(Plane *p, PyObject *args) {
    int bye, bad;
    Session *s = channel_and_bye(p, args, &bye, &bad);
    if (bad) return NULL;
    if (!s || !s->rtcp) Py_RETURN_FALSE;
    report_now(p, s, bye);
    Py_RETURN_TRUE;
}

static PyObject *Plane_remove(Plane *p, PyObject *args) {
    int bye, bad;
    Session *s = channel_and_bye(p, args, &bye, &bad);
    if (bad) return NULL;
    if (!s) Py_RETURN_FALSE;
    if (bye && s->rtcp) report_now(p, s, 1);
    if (s->fd < 0) table_remove(p, s->key);
    unsigned last = p->order[--p->live];  /* the last live slot takes this one's place */
    p->order[s->order_pos] = (uint16_t)last;
    p->sessions[last].order_pos = s->order_pos;
    session_free(s);
    Py_RETURN_TRUE;
}

static PyObject *read_socket(Plane *p, int fd, Session *own, int max_batches) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int b = 0; b < max_batches; b++) {
        for (int i = 0; i < BATCH; i++) {
            p->rmsgs[i].msg_hdr.msg_name = &p->rnames[i];
            p->rmsgs[i].msg_hdr.msg_namelen = sizeof p->rnames[i];
            p->rmsgs[i].msg_hdr.msg_control = &p->rctl[i];
            p->rmsgs[i].msg_hdr.msg_controllen = sizeof p->rctl[i];
            p->rmsgs[i].msg_hdr.msg_flags = 0;
        }
        int n = recvmmsg(fd, p->rmsgs, BATCH, MSG_DONTWAIT, NULL);
        if (n <= 0) break;      /* EAGAIN, or an error Python's own read will see */
        double now = wall_s();
        for (int i = 0; i < n; i++) {
            uint8_t *data = p->rbuf + (size_t)i * SLOT_BYTES;
            int len = (int)p->rmsgs[i].msg_len;
            p->rx_wall = kernel_time(&p->rmsgs[i].msg_hdr, now);
            p->counters[C_DATAGRAMS]++;
            if (p->rnames[i].sin_family != AF_INET) {   /* the socket is IPv4 */
                p->counters[C_NOT_IPV4]++;
                continue;
            }
            if (p->rmsgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
                p->counters[C_RECV_TRUNCATED]++;   /* nothing of ours is that big */
                continue;
            }
            if (handle(p, data, len, &p->rnames[i], own)) continue;
            p->counters[C_TO_PYTHON]++;
            PyObject *item = to_python(data, len, &p->rnames[i]);
            if (!item || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(item);
        }
        if (n < BATCH) break;
    }
    return out;
}

static PyObject *Plane_read(Plane *p, PyObject *args) {
    int max_batches = 4;
    if (!PyArg_ParseTuple(args, "|i", &max_batches)) return NULL;
    if (p->fd < 0) return PyList_New(0);
    return read_socket(p, p->fd, NULL, max_batches);
}

static PyObject *Plane_read_session(Plane *p, PyObject *args) {
    PyObject *arg;
    uint32_t channel;
    int max_batches = 2;
    if (!PyArg_ParseTuple(args, "O|i", &arg, &max_batches) || channel_arg(arg, &channel) < 0)
        return NULL;
    Session *s = by_channel(p, (uint32_t)channel);
    if (!s || s->fd < 0) {
        PyErr_SetString(PyExc_KeyError, "no session with a socket of its own on that channel");
        return NULL;
    }
    return read_socket(p, s->fd, s, max_batches);
}

static PyObject *Plane_take_arrivals(Plane *p, PyObject *arg) {
    uint32_t channel;
    if (channel_arg(arg, &channel) < 0) return NULL;
    Session *s = by_channel(p, (uint32_t)channel);
    if (!s || !s->arrivals) Py_RETURN_NONE;
    PyObject *blob = PyBytes_FromStringAndSize((const char *)s->arrivals,
                                               (Py_ssize_t)(s->narrivals * sizeof(Arrival)));
    s->narrivals = 0;
    return blob;
}

static PyObject *Plane_take_heard(Plane *p, PyObject *arg) {
    uint32_t channel;
    if (channel_arg(arg, &channel) < 0) return NULL;
    Session *s = by_channel(p, (uint32_t)channel);
    if (!s || !s->heard) Py_RETURN_NONE;
    PyObject *blob = PyBytes_FromStringAndSize((const char *)s->heard, (Py_ssize_t)s->heard_len);
    s->heard_len = 0;
    return blob;
}

/* Decode a keeping client's frames in the order given (its playout order): records
 * [u16 length, native order][Opus payload]; 20 ms of mono 48 kHz PCM each, silence where
 * libopus refuses one (drop_decode). */
static PyObject *Plane_decode(Plane *p, PyObject *args) {
    PyObject *arg;
    Py_buffer in;
    uint32_t channel;
    if (!PyArg_ParseTuple(args, "Oy*", &arg, &in)) return NULL;
    PyObject *out = NULL;
    if (channel_arg(arg, &channel) < 0) goto done;
    Session *s = by_channel(p, (uint32_t)channel);
    if (!s || !s->heard) {
        PyErr_SetString(PyExc_ValueError, "no keeping client session on that channel");
        goto done;
    }
    const uint8_t *r = in.buf;
    Py_ssize_t n = 0;
    for (Py_ssize_t off = 0; off < in.len; n++) {
        uint16_t len;
        if (off + 2 > in.len) goto bad;
        memcpy(&len, r + off, 2);
        if (len == 0 || len > OPUS_MAX || off + 2 + len > in.len) goto bad;
        off += 2 + len;
    }
    out = PyBytes_FromStringAndSize(NULL, n * PCM_SAMPLES * 2);
    if (!out) goto done;
    opus_int16 *pcm = (opus_int16 *)PyBytes_AS_STRING(out);
    for (Py_ssize_t off = 0, k = 0; k < n; k++, pcm += PCM_SAMPLES) {
        uint16_t len;
        memcpy(&len, r + off, 2);
        int got = opus_decode(s->dec, r + off + 2, len, pcm, PCM_SAMPLES, 0);
        if (got < 0) {
            p->counters[C_DROP_DECODE]++;
            got = 0;
        }
        memset(pcm + got, 0, (size_t)(PCM_SAMPLES - got) * 2);
        off += 2 + len;
    }
    goto done;
bad:
    PyErr_SetString(PyExc_ValueError, "decode: records are [u16 length 1-1275][payload]");
done:
    PyBuffer_Release(&in);
    return out;
}

static PyObject *Plane_process(Plane *p, PyObject *args) {
    /* One datagram as if received from addr (tests, fuzzing): None when the plane took it,
     * else the bytes Python would get. */
    Py_buffer data;
    PyObject *addr;
    if (!PyArg_ParseTuple(args, "y*O", &data, &addr)) return NULL;
    struct sockaddr_in src;
    if (parse_v4(addr, &src) < 0) { PyBuffer_Release(&data); return NULL; }
    PyObject *result;
    p->counters[C_DATAGRAMS]++;
    p->rx_wall = wall_s();
    if (data.len > SLOT_BYTES) {
        p->counters[C_RECV_TRUNCATED]++;
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }
    uint8_t buf[SLOT_BYTES];
    memcpy(buf, data.buf, (size_t)data.len);
    int len = (int)data.len;
    PyBuffer_Release(&data);
    if (handle(p, buf, len, &src, NULL)) Py_RETURN_NONE;
    p->counters[C_TO_PYTHON]++;
    result = PyBytes_FromStringAndSize((const char *)buf, len);
    return result;
}

static PyObject *Plane_take_batch(Plane *p, PyObject *noargs) {
    size_t total = 0;
    for (unsigned i = 0; i < p->live; i++) {
        Session *s = &p->sessions[p->order[i]];
        for (unsigned k = 0; k < s->in.count; k++)
            total += 6 + s->in.frames[(s->in.head + k) % RING].len;
    }
    if (!total) Py_RETURN_NONE;
    PyObject *blob = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!blob) return NULL;
    uint8_t *w = (uint8_t *)PyBytes_AS_STRING(blob);
    for (unsigned i = 0; i < p->live; i++) {
        Session *s = &p->sessions[p->order[i]];
        Frame *f;
        while ((f = ring_pop(&s->in))) {
            uint32_t ch = htonl(s->channel);
            uint16_t len = htons(f->len);
            memcpy(w, &ch, 4);
            memcpy(w + 4, &len, 2);
            memcpy(w + 6, f->data, f->len);
            w += 6 + f->len;
        }
    }
    return blob;
}

static PyObject *Plane_put_batch(Plane *p, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *r = b.buf;
    Py_ssize_t left = b.len;
    long queued = 0;
    while (left > 0) {
        if (left < 6) { p->counters[C_BATCH_BAD_RECORD]++; break; }
        uint32_t ch = (uint32_t)r[0] << 24 | r[1] << 16 | r[2] << 8 | r[3];
        unsigned len = (unsigned)(r[4] << 8 | r[5]);
        if ((Py_ssize_t)len > left - 6) { p->counters[C_BATCH_BAD_RECORD]++; break; }
        const uint8_t *payload = r + 6;
        r += 6 + len;
        left -= 6 + (Py_ssize_t)len;
        Session *s = by_channel(p, ch);
        if (!s) { p->counters[C_BATCH_UNKNOWN_CHANNEL]++; continue; }
        int dropped;
        if (s->pcm && len != PCM_SAMPLES * 2) {
            /* an Opus payload from an agent that encodes its own audio: sent as it is; no
             * sound of this session's encoder to end after it */
            if (len == 0 || len > OPUS_MAX) { p->counters[C_BATCH_BAD_RECORD]++; continue; }
            s->coded_silence = CODED_SILENCE;
            ring_push(&s->out, payload, len, OUT_KEEP, &dropped);
        } else if (s->pcm) {
            opus_int16 pcm[PCM_SAMPLES];
            memcpy(pcm, payload, sizeof pcm);
            uint8_t coded[FRAME_MAX];
            int n = opus_encode(s->enc, pcm, PCM_SAMPLES, coded, 1275);
            if (n <= 0) { p->counters[C_DROP_ENCODE]++; continue; }
            s->coded_silence = 0;
            ring_push(&s->out, coded, (unsigned)n, OUT_KEEP, &dropped);
        } else {
            if (len == 0 || len > 1275) { p->counters[C_BATCH_BAD_RECORD]++; continue; }
            ring_push(&s->out, payload, len, OUT_KEEP, &dropped);
        }
        if (dropped) p->counters[C_DROP_OUT_QUEUE_FULL]++;
        queued++;
    }
    PyBuffer_Release(&b);
    return PyLong_FromLong(queued);
}

/* A pcm session's next silent frame through its encoder (the cached packet if that fails). */
static void send_coded_silence(Plane *p, Session *s) {
    static const opus_int16 zeros[PCM_SAMPLES];
    uint8_t coded[FRAME_MAX];
    s->coded_silence++;
    int n = opus_encode(s->enc, zeros, PCM_SAMPLES, coded, 1275);
    if (n > 0) {
        send_frame(p, s, coded, (unsigned)n);
    } else {
        p->counters[C_DROP_ENCODE]++;
        send_frame(p, s, s->silence, s->silence_len);
    }
}

static PyObject *Plane_tick(Plane *p, PyObject *args) {
    int frames = 1, group = -1;
    if (!PyArg_ParseTuple(args, "|ii", &frames, &group)) return NULL;
    if (frames < 1) frames = 1;
    if (frames > OUT_KEEP) frames = OUT_KEEP;
    long sent = 0;
    int64_t now = mono_ns();
    for (unsigned i = 0; i < p->live; i++) {
        Session *s = &p->sessions[p->order[i]];
        if (s->rtcp && now >= s->next_rtcp_ns) {
            send_report(p, s, now, 0);
            s->next_rtcp_ns = next_report_ns(p, now);
        }
    }
    for (int f = 0; f < frames; f++) {
        for (unsigned i = 0; i < p->live; i++) {
            Session *s = &p->sessions[p->order[i]];
            if (group >= 0 && s->group != group) continue;
            Frame *fr = ring_pop(&s->out);
            if (fr) send_frame(p, s, fr->data, fr->len);
            else if (s->pcm && s->enc && s->coded_silence < CODED_SILENCE)
                send_coded_silence(p, s);
            else if (s->script_n) {
                unsigned k = s->script_pos++ % s->script_n;
                send_frame(p, s, s->script + s->script_off[k], s->script_len[k]);
            } else send_frame(p, s, s->silence, s->silence_len);
            sent++;
        }
    }
    flush(p);
    return PyLong_FromLong(sent);
}

static PyObject *Plane_stats(Plane *p, PyObject *arg) {
    uint32_t channel;
    if (channel_arg(arg, &channel) < 0) return NULL;
    Session *s = by_channel(p, (uint32_t)channel);
    if (!s) Py_RETURN_NONE;
    PyObject *gaps = PyList_New(s->ngaps);
    if (!gaps) return NULL;
    for (unsigned i = 0; i < s->ngaps; i++)
        PyList_SET_ITEM(gaps, i, Py_BuildValue("(dd)", s->gaps[i][0], s->gaps[i][1]));
    s->ngaps = 0;
    char relay[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &s->relay.sin_addr, relay, sizeof relay);
    PyObject *d = Py_BuildValue(
        "{s:O,s:k,s:I,s:I,s:I,s:I,s:L,s:I,s:L,s:N,s:I,s:K,s:I,s:I,s:I,s:I,s:I,s:(si),s:d,s:d}",
        "have_ssrc", s->have_ssrc ? Py_True : Py_False, "rx_ssrc", (unsigned long)s->rx_ssrc,
        "packets_received", s->packets_received, "cycles", s->cycles,
        "base_seq", (unsigned)s->base_seq, "max_seq", (unsigned)s->max_seq,
        "jitter_q4", (long long)s->jitter_q4, "last_timestamp", s->last_ts,
        "last_arrival", (long long)s->last_arrival,
        "gaps", gaps, "gaps_lost", s->gaps_lost,
        "last_ntp", (unsigned long long)s->last_ntp, "last_rtp_timestamp", s->last_rtp_ts,
        "packets_sent", s->packets_sent, "octets_sent", s->octets_sent,
        "in_queued", s->in.count, "out_queued", s->out.count,
        "relay", relay, (int)ntohs(s->relay.sin_port),
        "first_rx_unix", s->first_wall, "last_rx_unix", s->last_wall);
    if (!d || !s->rtcp) return d;
    PyObject *rtcp = Py_BuildValue(
        "{s:N,s:N,s:I,s:I,s:I,s:N,s:i,s:O}",
        "rtt_s", s->rtt_samples ? PyFloat_FromDouble(s->rtt_s) : Py_NewRef(Py_None),
        "rtt_last_s", s->rtt_samples ? PyFloat_FromDouble(s->rtt_last_s) : Py_NewRef(Py_None),
        "rtt_samples", s->rtt_samples, "rtcp_in", s->rtcp_in, "rtcp_out", s->rtcp_out,
        "remote", s->remote_report
            ? Py_BuildValue("{s:I,s:i,s:k,s:k}", "fraction_lost", (unsigned)s->remote_fraction,
                            "packets_lost", (int)s->remote_lost,
                            "highest_sequence", (unsigned long)s->remote_highest,
                            "jitter", (unsigned long)s->remote_jitter)
            : Py_NewRef(Py_None),
        "sr_received", s->sr_lsr != 0, "bye", s->bye ? Py_True : Py_False);
    if (!rtcp || PyDict_Update(d, rtcp) < 0) { Py_XDECREF(rtcp); Py_DECREF(d); return NULL; }
    Py_DECREF(rtcp);
    return d;
}

static PyObject *Plane_counters(Plane *p, PyObject *noargs) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int i = 0; i < C_COUNTERS; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(p->counters[i]);
        if (!v || PyDict_SetItemString(d, COUNTER_NAMES[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *Plane_sessions(Plane *p, void *closure) {
    return PyLong_FromUnsignedLong(p->live);
}

static PyMethodDef Plane_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Plane_add, METH_VARARGS | METH_KEYWORDS,
     "add(client, relay, profile, rx_key, tx_key, ssrc, seq, timestamp, payload_type, mid, "
     "mid_id, abs_send_time_id, silence, pcm=False, fd=-1, script=<a client session's>, "
     "rtcp=False, turn_channel=0, "
     "cname=b'', keep=False, group=0) -> channel"},
    {"remove", (PyCFunction)Plane_remove, METH_VARARGS,
     "remove(channel, bye=False) -> whether it was there (bye: a last report with BYE first)"},
    {"report", (PyCFunction)Plane_report, METH_VARARGS,
     "report(channel, bye=False) -> whether a report went out now (an rtcp session)"},
    {"set_pcm", (PyCFunction)Plane_set_pcm, METH_VARARGS,
     "set_pcm(channel, pcm) -> whether the session is there: pcm16 (True) or Opus frames"},
    {"clear", (PyCFunction)Plane_clear, METH_O,
     "clear(channel) -> how many of the agent's frames queued towards the client were dropped"},
    {"move", (PyCFunction)Plane_move, METH_VARARGS,
     "move(channel, client, relay) -> whether the session is there: its client is now at "
     "client (through relay, or None)"},
    {"read", (PyCFunction)Plane_read, METH_VARARGS,
     "read(max_batches=4) -> [(datagram, (host, port))] that are Python's"},
    {"read_session", (PyCFunction)Plane_read_session, METH_VARARGS,
     "read_session(channel, max_batches=2) -> what of its own socket's datagrams is Python's"},
    {"take_arrivals", (PyCFunction)Plane_take_arrivals, METH_O,
     "take_arrivals(channel) -> the logged arrivals, packed '=dIHH' (at, ssrc, seq, size)"},
    {"take_heard", (PyCFunction)Plane_take_heard, METH_O,
     "take_heard(channel) -> a keeping client's heard packets: records '=dHIH' (arrival, seq, "
     "timestamp, length) + payload, or None"},
    {"decode", (PyCFunction)Plane_decode, METH_VARARGS,
     "decode(channel, records) -> mono 48 kHz s16 PCM, 960 samples per [u16 length][payload]"},
    {"process", (PyCFunction)Plane_process, METH_VARARGS,
     "process(datagram, (host, port)) -> None if the plane took it, else the datagram"},
    {"take_batch", (PyCFunction)Plane_take_batch, METH_NOARGS,
     "take_batch() -> the queued frames for the agent as records, or None"},
    {"put_batch", (PyCFunction)Plane_put_batch, METH_O,
     "put_batch(records) -> frames queued towards the clients"},
    {"tick", (PyCFunction)Plane_tick, METH_VARARGS,
     "tick(frames=1, group=-1) -> RTP packets sent (frames 20 ms frames per session; of the "
     "sessions added with that group only, when group >= 0)"},
    {"stats", (PyCFunction)Plane_stats, METH_O, "stats(channel) -> dict or None"},
    {"counters", (PyCFunction)Plane_counters, METH_NOARGS, "counters() -> dict"},
    {NULL}
};

static PyGetSetDef Plane_getset[] = {
    {"sessions", (getter)Plane_sessions, NULL, "sessions on the plane", NULL},
    {NULL}
};

static PyTypeObject PlaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "services.mediaplane._mediaplane.Plane",
    .tp_basicsize = sizeof(Plane),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The native media plane of one shared socket (see the module's source).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plane_init,
    .tp_dealloc = (destructor)Plane_dealloc,
    .tp_methods = Plane_methods,
    .tp_getset = Plane_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_mediaplane", "The transceiver's native media plane.", -1, NULL,
};

PyMODINIT_FUNC PyInit__mediaplane(void) {
    if (PyType_Ready(&PlaneType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&PlaneType);
    if (PyModule_AddObject(m, "Plane", (PyObject *)&PlaneType) < 0) {
        Py_DECREF(&PlaneType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "BATCH", BATCH);
    PyModule_AddIntConstant(m, "FRAME_MAX", FRAME_MAX);
    return m;
}
