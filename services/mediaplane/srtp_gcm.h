/* SRTP and SRTCP with AEAD_AES_128_GCM / AEAD_AES_256_GCM (RFC 7714) on OpenSSL's EVP.
 *
 * The media plane's own SRTP for the profiles aiortc negotiates first: one reused GCM context
 * per key, so a packet costs one IV set and one AEAD pass (bench/srtp_floor.c measures
 * libsrtp2 on NSS at about three times that). libsrtp stays the reference (the plane's
 * srtp="libsrtp"), and the behaviour follows it: the same packet index estimate and replay
 * windows (1024 packets for RTP, as the plane asks libsrtp for, 128 for SRTCP), the first
 * SRTCP index sent is 1, a stream's replay state starts with its first authenticated packet.
 */
#ifndef VOICEEDGE_SRTP_GCM_H
#define VOICEEDGE_SRTP_GCM_H

#include <stdint.h>
#include <openssl/evp.h>

#define GCM_TAG_LEN 16
#define GCM_SALT_LEN 12
#define GCM_SRTCP_TRAILER 4                   /* E flag and 31-bit SRTCP index */
#define GCM_MAX_EXPANSION (GCM_TAG_LEN + GCM_SRTCP_TRAILER)
#define GCM_RTP_WINDOW 1024
#define GCM_RTCP_WINDOW 128
#define GCM_STREAMS 4                         /* SSRCs per side (the plane's SSRCS) */

/* Results, in the order of the plane's drop counters. */
enum { GCM_OK = 0, GCM_AUTH, GCM_REPLAY, GCM_OTHER };

typedef struct {
    uint64_t top;                             /* the highest index authenticated */
    uint64_t bits[GCM_RTP_WINDOW / 64];       /* bit k: index top - k was */
} GcmWindow;

typedef struct {
    uint32_t ssrc;
    GcmWindow rtp;                            /* RTP: ROC << 16 | SEQ */
    GcmWindow rtcp;                           /* SRTCP index (received), */
    uint32_t rtcp_sent;                       /* or the last one sent */
} GcmStream;

typedef struct {
    EVP_CIPHER_CTX *ctx;                      /* keyed once; only the IV changes per packet */
    uint8_t salt[GCM_SALT_LEN];
} GcmKey;

/* One direction of a session: its keys and the replay state of each SSRC it carried. */
typedef struct {
    GcmKey rtp, rtcp;
    GcmStream streams[GCM_STREAMS];
    unsigned nstreams;
} GcmSide;

/* Whether a libsrtp profile number is one of the two GCM profiles; its key length (16 or
 * 32 bytes, the salt is 12) through *key_len. */
int gcm_profile(int profile, int *key_len);

/* Derive the session keys from master key || master salt (RFC 3711 4.3 with RFC 7714 11's
 * AES-CM PRF) and key the contexts, to protect (encrypt 1) or unprotect. 0, or -1 (OpenSSL
 * failed; nothing left to free). */
int gcm_side_init(GcmSide *side, int key_len, const uint8_t *master, int encrypt);
void gcm_side_free(GcmSide *side);

/* In place. Protecting needs GCM_MAX_EXPANSION bytes of room after *len. */
int gcm_protect_rtp(GcmSide *side, uint8_t *pkt, int *len);
int gcm_unprotect_rtp(GcmSide *side, uint8_t *pkt, int *len);
int gcm_protect_rtcp(GcmSide *side, uint8_t *pkt, int *len);
int gcm_unprotect_rtcp(GcmSide *side, uint8_t *pkt, int *len);

#endif
