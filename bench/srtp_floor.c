/* The SRTP crypto floor of one media packet: libsrtp2 (as the media plane calls it) against
 * the same AEAD done straight on OpenSSL with one reused context.
 *
 *     srtp_floor PACKETS ROUNDS PAYLOAD_BYTES
 *
 * prints one JSON object: for each case the median over ROUNDS of the thread CPU time per
 * packet in microseconds.  Built and run by bench/srtp_floor.py. */
#include <openssl/evp.h>
#include <srtp2/srtp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HEADER 12
#define SLOT 1500

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void rtp_header(uint8_t *p, uint32_t index)
{
    p[0] = 0x80;
    p[1] = 111;
    p[2] = (uint8_t)(index >> 8);
    p[3] = (uint8_t)index;
    uint32_t ts = index * 960;
    p[4] = ts >> 24; p[5] = ts >> 16; p[6] = ts >> 8; p[7] = ts;
    p[8] = 0x12; p[9] = 0x34; p[10] = 0x56; p[11] = 0x78;
}

static srtp_t session(srtp_profile_t profile, int inbound, const uint8_t *key)
{
    srtp_policy_t policy;
    memset(&policy, 0, sizeof policy);
    if (srtp_crypto_policy_set_from_profile_for_rtp(&policy.rtp, profile) ||
        srtp_crypto_policy_set_from_profile_for_rtcp(&policy.rtcp, profile))
        return NULL;
    policy.ssrc.type = inbound ? ssrc_any_inbound : ssrc_any_outbound;
    policy.key = (unsigned char *)key;
    policy.window_size = 1024;
    srtp_t s = NULL;
    return srtp_create(&s, &policy) == srtp_err_status_ok ? s : NULL;
}

/* Per-packet microseconds to protect, then to unprotect, `packets` packets (fresh sessions
 * each round, sequence numbers counting up so replay protection passes). */
static int libsrtp_round(srtp_profile_t profile, int packets, int payload, uint8_t *bufs,
                         int *lens, double *protect_us, double *unprotect_us)
{
    uint8_t key[64];
    for (int i = 0; i < 64; i++) key[i] = (uint8_t)(i * 7 + 1);
    srtp_t tx = session(profile, 0, key), rx = session(profile, 1, key);
    if (!tx || !rx) return -1;
    for (int i = 0; i < packets; i++) {
        uint8_t *p = bufs + (size_t)i * SLOT;
        rtp_header(p, (uint32_t)i);
        memset(p + HEADER, i & 0xff, payload);
        lens[i] = HEADER + payload;
    }
    double t0 = now_us();
    for (int i = 0; i < packets; i++)
        if (srtp_protect(tx, bufs + (size_t)i * SLOT, &lens[i]) != srtp_err_status_ok) return -1;
    double t1 = now_us();
    for (int i = 0; i < packets; i++)
        if (srtp_unprotect(rx, bufs + (size_t)i * SLOT, &lens[i]) != srtp_err_status_ok) return -1;
    double t2 = now_us();
    srtp_dealloc(tx);
    srtp_dealloc(rx);
    *protect_us = (t1 - t0) / packets;
    *unprotect_us = (t2 - t1) / packets;
    return 0;
}

/* RFC 7714's IV: the salt XOR (SSRC, ROC (0 here), sequence number). */
static void gcm_iv(uint8_t *iv, const uint8_t *salt, const uint8_t *rtp)
{
    memcpy(iv, salt, 12);
    for (int i = 0; i < 4; i++) iv[2 + i] ^= rtp[8 + i];
    iv[10] ^= rtp[2];
    iv[11] ^= rtp[3];
}

/* The AEAD an SRTP GCM packet needs (RFC 7714: a 12-byte IV from salt, SSRC and index, the
 * header as AAD, a 16-byte tag), on OpenSSL with the key schedule done once per session. */
static int openssl_round(const EVP_CIPHER *cipher, int packets, int payload, uint8_t *bufs,
                         double *seal_us, double *open_us)
{
    uint8_t key[32], salt[12], iv[12], tag[16];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(i * 5 + 3);
    memset(salt, 0x5a, sizeof salt);
    EVP_CIPHER_CTX *enc = EVP_CIPHER_CTX_new(), *dec = EVP_CIPHER_CTX_new();
    if (!enc || !dec || !EVP_EncryptInit_ex(enc, cipher, NULL, key, NULL) ||
        !EVP_DecryptInit_ex(dec, cipher, NULL, key, NULL))
        return -1;
    int n;
    for (int i = 0; i < packets; i++) {
        uint8_t *p = bufs + (size_t)i * SLOT;
        rtp_header(p, (uint32_t)i);
        memset(p + HEADER, i & 0xff, payload);
    }
    double t0 = now_us();
    for (int i = 0; i < packets; i++) {
        uint8_t *p = bufs + (size_t)i * SLOT;
        gcm_iv(iv, salt, p);
        if (!EVP_EncryptInit_ex(enc, NULL, NULL, NULL, iv) ||
            !EVP_EncryptUpdate(enc, NULL, &n, p, HEADER) ||
            !EVP_EncryptUpdate(enc, p + HEADER, &n, p + HEADER, payload) ||
            !EVP_EncryptFinal_ex(enc, p + HEADER + payload, &n) ||
            !EVP_CIPHER_CTX_ctrl(enc, EVP_CTRL_GCM_GET_TAG, 16, p + HEADER + payload))
            return -1;
    }
    double t1 = now_us();
    for (int i = 0; i < packets; i++) {
        uint8_t *p = bufs + (size_t)i * SLOT;
        gcm_iv(iv, salt, p);
        memcpy(tag, p + HEADER + payload, 16);
        if (!EVP_DecryptInit_ex(dec, NULL, NULL, NULL, iv) ||
            !EVP_DecryptUpdate(dec, NULL, &n, p, HEADER) ||
            !EVP_DecryptUpdate(dec, p + HEADER, &n, p + HEADER, payload) ||
            !EVP_CIPHER_CTX_ctrl(dec, EVP_CTRL_GCM_SET_TAG, 16, tag) ||
            EVP_DecryptFinal_ex(dec, p + HEADER + payload, &n) <= 0)
            return -1;   /* a tag that does not verify: the round measured nothing */
    }
    double t2 = now_us();
    EVP_CIPHER_CTX_free(enc);
    EVP_CIPHER_CTX_free(dec);
    *seal_us = (t1 - t0) / packets;
    *open_us = (t2 - t1) / packets;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s PACKETS ROUNDS PAYLOAD_BYTES\n", argv[0]);
        return 2;
    }
    int packets = atoi(argv[1]), rounds = atoi(argv[2]), payload = atoi(argv[3]);
    if (packets < 1 || packets > 60000 || rounds < 1 || rounds > 99 || payload < 1 ||
        payload > SLOT - HEADER - 64) {
        fprintf(stderr, "PACKETS 1..60000, ROUNDS 1..99, PAYLOAD_BYTES 1..%d\n",
                SLOT - HEADER - 64);
        return 2;
    }
    if (srtp_init() != srtp_err_status_ok) return 1;
    uint8_t *bufs = malloc((size_t)packets * SLOT);
    int *lens = malloc(sizeof(int) * (size_t)packets);
    double *a = malloc(sizeof(double) * rounds * 6);
    if (!bufs || !lens || !a) return 1;
    double *gcm_p = a, *gcm_u = a + rounds, *cm_p = a + 2 * rounds, *cm_u = a + 3 * rounds;
    double *ossl_s = a + 4 * rounds, *ossl_o = a + 5 * rounds;
    for (int r = 0; r < rounds; r++) {
        if (libsrtp_round(srtp_profile_aead_aes_256_gcm, packets, payload, bufs, lens,
                          &gcm_p[r], &gcm_u[r]) ||
            libsrtp_round(srtp_profile_aes128_cm_sha1_80, packets, payload, bufs, lens,
                          &cm_p[r], &cm_u[r]) ||
            openssl_round(EVP_aes_256_gcm(), packets, payload, bufs, &ossl_s[r], &ossl_o[r])) {
            fprintf(stderr, "a round failed\n");
            return 1;
        }
    }
    printf("{\"packets\": %d, \"rounds\": %d, \"payload_bytes\": %d, "
           "\"libsrtp_aead_aes_256_gcm\": {\"protect_us\": %.3f, \"unprotect_us\": %.3f}, "
           "\"libsrtp_aes128_cm_sha1_80\": {\"protect_us\": %.3f, \"unprotect_us\": %.3f}, "
           "\"openssl_aes_256_gcm\": {\"protect_us\": %.3f, \"unprotect_us\": %.3f}}\n",
           packets, rounds, payload, median(gcm_p, rounds), median(gcm_u, rounds),
           median(cm_p, rounds), median(cm_u, rounds), median(ossl_s, rounds),
           median(ossl_o, rounds));
    free(bufs);
    free(lens);
    free(a);
    srtp_shutdown();
    return 0;
}
