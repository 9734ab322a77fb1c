/* SRTP and SRTCP with AES-GCM (RFC 7714) on OpenSSL's EVP: see srtp_gcm.h. */
#include "srtp_gcm.h"

#include <string.h>

#define PROFILE_AEAD_AES_128_GCM 7            /* libsrtp's srtp_profile_t numbers */
#define PROFILE_AEAD_AES_256_GCM 8
#define LABEL_RTP_KEY 0x00                    /* RFC 3711 4.3.1 (the auth labels: unused) */
#define LABEL_RTP_SALT 0x02
#define LABEL_RTCP_KEY 0x03
#define LABEL_RTCP_SALT 0x05
#define SEQ_MEDIAN 0x8000
#define SEQ_SPAN 0x10000

static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void wr32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

int gcm_profile(int profile, int *key_len) {
    if (profile == PROFILE_AEAD_AES_128_GCM) { *key_len = 16; return 1; }
    if (profile == PROFILE_AEAD_AES_256_GCM) { *key_len = 32; return 1; }
    return 0;
}

/* ------------------------------------------------------------------ keys */

/* The AES-CM PRF: the keystream of AES-CTR under the master key from IV = (master salt,
 * zero-padded to 112 bits, XOR the label at byte 7) || 0x0000. */
static int derive(EVP_CIPHER_CTX *prf, const uint8_t *salt, uint8_t label, uint8_t *out, int n) {
    uint8_t iv[16] = {0}, zeros[32] = {0};
    int done;
    memcpy(iv, salt, GCM_SALT_LEN);
    iv[7] ^= label;
    return EVP_EncryptInit_ex(prf, NULL, NULL, NULL, iv) == 1 &&
           EVP_EncryptUpdate(prf, out, &done, zeros, n) == 1 && done == n ? 0 : -1;
}

static int key_init(GcmKey *k, const EVP_CIPHER *gcm, EVP_CIPHER_CTX *prf, const uint8_t *salt,
                    int key_len, uint8_t key_label, uint8_t salt_label, int encrypt) {
    uint8_t key[32];
    int ok = derive(prf, salt, key_label, key, key_len) == 0 &&
             derive(prf, salt, salt_label, k->salt, GCM_SALT_LEN) == 0 &&
             (k->ctx = EVP_CIPHER_CTX_new()) != NULL &&
             EVP_CipherInit_ex(k->ctx, gcm, NULL, key, NULL, encrypt) == 1;
    memset(key, 0, sizeof key);
    return ok ? 0 : -1;
}

int gcm_side_init(GcmSide *side, int key_len, const uint8_t *master, int encrypt) {
    memset(side, 0, sizeof *side);
    const EVP_CIPHER *ctr = key_len == 32 ? EVP_aes_256_ctr() : EVP_aes_128_ctr();
    const EVP_CIPHER *gcm = key_len == 32 ? EVP_aes_256_gcm() : EVP_aes_128_gcm();
    const uint8_t *salt = master + key_len;
    EVP_CIPHER_CTX *prf = EVP_CIPHER_CTX_new();
    int ok = prf && EVP_EncryptInit_ex(prf, ctr, NULL, master, NULL) == 1 &&
             key_init(&side->rtp, gcm, prf, salt, key_len, LABEL_RTP_KEY, LABEL_RTP_SALT,
                      encrypt) == 0 &&
             key_init(&side->rtcp, gcm, prf, salt, key_len, LABEL_RTCP_KEY, LABEL_RTCP_SALT,
                      encrypt) == 0;
    EVP_CIPHER_CTX_free(prf);
    if (!ok) gcm_side_free(side);
    return ok ? 0 : -1;
}

void gcm_side_free(GcmSide *side) {
    EVP_CIPHER_CTX_free(side->rtp.ctx);
    EVP_CIPHER_CTX_free(side->rtcp.ctx);
    memset(side, 0, sizeof *side);
}

/* ------------------------------------------------------------------ replay windows */

static int window_check(const GcmWindow *w, unsigned size, uint64_t index) {
    if (index > w->top) return GCM_OK;
    uint64_t k = w->top - index;
    if (k >= size) return GCM_REPLAY;
    return (w->bits[k / 64] >> (k % 64)) & 1 ? GCM_REPLAY : GCM_OK;
}

static void window_add(GcmWindow *w, unsigned size, uint64_t index) {
    unsigned words = size / 64;
    uint64_t k = 0;
    if (index > w->top) {
        uint64_t shift = index - w->top;
        if (shift >= size) {
            memset(w->bits, 0, words * sizeof(uint64_t));
        } else {
            unsigned whole = (unsigned)(shift / 64), part = (unsigned)(shift % 64);
            for (unsigned i = words; i-- > 0;) {
                uint64_t v = i >= whole ? w->bits[i - whole] << part : 0;
                if (part && i >= whole + 1) v |= w->bits[i - whole - 1] >> (64 - part);
                w->bits[i] = v;
            }
        }
        w->top = index;
    } else {
        k = w->top - index;
    }
    w->bits[k / 64] |= 1ull << (k % 64);
}

/* The stream of ``ssrc``, or where a new one would go (NULL: no room). *fresh tells which. */
static GcmStream *stream_of(GcmSide *side, uint32_t ssrc, GcmStream *scratch, int *fresh) {
    for (unsigned i = 0; i < side->nstreams; i++)
        if (side->streams[i].ssrc == ssrc) { *fresh = 0; return &side->streams[i]; }
    if (side->nstreams == GCM_STREAMS) return NULL;
    memset(scratch, 0, sizeof *scratch);
    scratch->ssrc = ssrc;
    *fresh = 1;
    return scratch;
}

static void stream_keep(GcmSide *side, const GcmStream *scratch) {
    side->streams[side->nstreams++] = *scratch;
}

/* The packet index of sequence number ``seq`` (RFC 3711 3.3.1, as libsrtp guesses it: ROC 0
 * while the highest index is below 2^15). */
static uint64_t rtp_index(const GcmWindow *w, uint16_t seq) {
    if (w->top <= SEQ_MEDIAN) return seq;
    uint32_t roc = (uint32_t)(w->top >> 16);
    uint16_t top_seq = (uint16_t)w->top;
    if (top_seq < SEQ_MEDIAN) {
        if ((int)seq - top_seq > SEQ_MEDIAN) roc--;
    } else if (top_seq - SEQ_MEDIAN > seq) {
        roc++;
    }
    return (uint64_t)roc << 16 | seq;
}

/* ------------------------------------------------------------------ the AEAD */

static int rtp_header_len(const uint8_t *pkt, int len) {
    if (len < 12 || (pkt[0] >> 6) != 2) return -1;
    int h = 12 + 4 * (pkt[0] & 0x0F);
    if (pkt[0] & 0x10) {
        if (h + 4 > len) return -1;
        h += 4 + 4 * (pkt[h + 2] << 8 | pkt[h + 3]);
    }
    return h > len ? -1 : h;
}

static void rtp_iv(uint8_t *iv, const GcmKey *k, uint32_t ssrc, uint64_t index) {
    uint8_t n[12] = {0};
    wr32(n + 2, ssrc);
    wr32(n + 6, (uint32_t)(index >> 16));
    n[10] = (uint8_t)(index >> 8);
    n[11] = (uint8_t)index;
    for (int i = 0; i < 12; i++) iv[i] = n[i] ^ k->salt[i];
}

static void rtcp_iv(uint8_t *iv, const GcmKey *k, uint32_t ssrc, uint32_t index) {
    uint8_t n[12] = {0};
    wr32(n + 2, ssrc);
    wr32(n + 8, index);
    for (int i = 0; i < 12; i++) iv[i] = n[i] ^ k->salt[i];
}

/* AAD ``aad`` (and ``aad2``), then ``n`` bytes at ``data`` in place, the tag at ``tag``. */
static int seal(GcmKey *k, const uint8_t *iv, const uint8_t *aad, int aad_len,
                const uint8_t *aad2, int aad2_len, uint8_t *data, int n, uint8_t *tag) {
    int out;
    return EVP_EncryptInit_ex(k->ctx, NULL, NULL, NULL, iv) == 1 &&
           EVP_EncryptUpdate(k->ctx, NULL, &out, aad, aad_len) == 1 &&
           (!aad2_len || EVP_EncryptUpdate(k->ctx, NULL, &out, aad2, aad2_len) == 1) &&
           (!n || EVP_EncryptUpdate(k->ctx, data, &out, data, n) == 1) &&
           EVP_EncryptFinal_ex(k->ctx, data + n, &out) == 1 &&
           EVP_CIPHER_CTX_ctrl(k->ctx, EVP_CTRL_GCM_GET_TAG, GCM_TAG_LEN, tag) == 1
        ? GCM_OK : GCM_OTHER;
}

static int open_(GcmKey *k, const uint8_t *iv, const uint8_t *aad, int aad_len,
                 const uint8_t *aad2, int aad2_len, uint8_t *data, int n, uint8_t *tag) {
    int out;
    if (EVP_DecryptInit_ex(k->ctx, NULL, NULL, NULL, iv) != 1 ||
        EVP_DecryptUpdate(k->ctx, NULL, &out, aad, aad_len) != 1 ||
        (aad2_len && EVP_DecryptUpdate(k->ctx, NULL, &out, aad2, aad2_len) != 1) ||
        (n && EVP_DecryptUpdate(k->ctx, data, &out, data, n) != 1) ||
        EVP_CIPHER_CTX_ctrl(k->ctx, EVP_CTRL_GCM_SET_TAG, GCM_TAG_LEN, tag) != 1)
        return GCM_OTHER;
    return EVP_DecryptFinal_ex(k->ctx, data + n, &out) == 1 ? GCM_OK : GCM_AUTH;
}

/* ------------------------------------------------------------------ SRTP */

int gcm_protect_rtp(GcmSide *side, uint8_t *pkt, int *len) {
    int h = rtp_header_len(pkt, *len), fresh;
    if (h < 0) return GCM_OTHER;
    GcmStream scratch, *st = stream_of(side, rd32(pkt + 8), &scratch, &fresh);
    if (!st) return GCM_OTHER;
    uint64_t index = rtp_index(&st->rtp, (uint16_t)(pkt[2] << 8 | pkt[3]));
    /* a repeated index is sent again (libsrtp's allow_repeat_tx, which the plane sets) */
    uint8_t iv[12];
    rtp_iv(iv, &side->rtp, st->ssrc, index);
    int e = seal(&side->rtp, iv, pkt, h, NULL, 0, pkt + h, *len - h, pkt + *len);
    if (e != GCM_OK) return e;
    if (window_check(&st->rtp, GCM_RTP_WINDOW, index) == GCM_OK)
        window_add(&st->rtp, GCM_RTP_WINDOW, index);
    if (fresh) stream_keep(side, st);
    *len += GCM_TAG_LEN;
    return GCM_OK;
}

int gcm_unprotect_rtp(GcmSide *side, uint8_t *pkt, int *len) {
    int h = rtp_header_len(pkt, *len), fresh;
    if (h < 0 || *len - h < GCM_TAG_LEN) return GCM_OTHER;
    GcmStream scratch, *st = stream_of(side, rd32(pkt + 8), &scratch, &fresh);
    if (!st) return GCM_OTHER;
    uint64_t index = rtp_index(&st->rtp, (uint16_t)(pkt[2] << 8 | pkt[3]));
    if (window_check(&st->rtp, GCM_RTP_WINDOW, index) != GCM_OK) return GCM_REPLAY;
    uint8_t iv[12];
    rtp_iv(iv, &side->rtp, st->ssrc, index);
    int n = *len - h - GCM_TAG_LEN;
    int e = open_(&side->rtp, iv, pkt, h, NULL, 0, pkt + h, n, pkt + h + n);
    if (e != GCM_OK) return e;
    window_add(&st->rtp, GCM_RTP_WINDOW, index);
    if (fresh) stream_keep(side, st);
    *len -= GCM_TAG_LEN;
    return GCM_OK;
}

/* ------------------------------------------------------------------ SRTCP (RFC 7714 9) */

int gcm_protect_rtcp(GcmSide *side, uint8_t *pkt, int *len) {
    if (*len < 8) return GCM_OTHER;
    int fresh;
    GcmStream scratch, *st = stream_of(side, rd32(pkt + 4), &scratch, &fresh);
    if (!st || st->rtcp_sent >= 0x7FFFFFFF) return GCM_OTHER;
    uint32_t index = st->rtcp_sent + 1;
    uint8_t iv[12], trailer[4];
    wr32(trailer, 0x80000000u | index);       /* E: encrypted */
    rtcp_iv(iv, &side->rtcp, st->ssrc, index);
    int n = *len - 8;
    int e = seal(&side->rtcp, iv, pkt, 8, trailer, 4, pkt + 8, n, pkt + *len);
    if (e != GCM_OK) return e;
    memcpy(pkt + *len + GCM_TAG_LEN, trailer, 4);
    st->rtcp_sent = index;
    if (fresh) stream_keep(side, st);
    *len += GCM_MAX_EXPANSION;
    return GCM_OK;
}

int gcm_unprotect_rtcp(GcmSide *side, uint8_t *pkt, int *len) {
    if (*len < 8 + GCM_MAX_EXPANSION) return GCM_OTHER;
    int fresh;
    GcmStream scratch, *st = stream_of(side, rd32(pkt + 4), &scratch, &fresh);
    if (!st) return GCM_OTHER;
    const uint8_t *trailer = pkt + *len - GCM_SRTCP_TRAILER;
    uint32_t word = rd32(trailer), index = word & 0x7FFFFFFF;
    if (window_check(&st->rtcp, GCM_RTCP_WINDOW, index) != GCM_OK) return GCM_REPLAY;
    uint8_t iv[12];
    rtcp_iv(iv, &side->rtcp, st->ssrc, index);
    int body = *len - 8 - GCM_MAX_EXPANSION, e;
    uint8_t *tag = pkt + 8 + body;
    if (word & 0x80000000u)
        e = open_(&side->rtcp, iv, pkt, 8, trailer, 4, pkt + 8, body, tag);
    else   /* sent in the clear: the whole packet is authenticated data */
        e = open_(&side->rtcp, iv, pkt, 8 + body, trailer, 4, tag, 0, tag);
    if (e != GCM_OK) return e;
    window_add(&st->rtcp, GCM_RTCP_WINDOW, index);
    if (fresh) stream_keep(side, st);
    *len -= GCM_MAX_EXPANSION;
    return GCM_OK;
}
