// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), self-contained: the
// arbiter's protocol MACs every frame, and the native client must not need a
// crypto library at build or run time.  Header-only, no state outside the
// objects.  Not constant-time beyond what HMAC needs (compare with Equal()).
#ifndef HOROVOD_PRIO_SCHEDULER_SHA256_H_
#define HOROVOD_PRIO_SCHEDULER_SHA256_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace horovod_prio {

class Sha256 {
 public:
  static constexpr size_t kDigest = 32;
  static constexpr size_t kBlock = 64;

  Sha256() { Reset(); }

  void Reset() {
    static const uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    std::memcpy(h_, kInit, sizeof h_);
    len_ = 0;
    fill_ = 0;
  }

  void Update(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    len_ += n;
    if (fill_) {
      const size_t k = n < kBlock - fill_ ? n : kBlock - fill_;
      std::memcpy(buf_ + fill_, p, k);
      fill_ += k;
      p += k;
      n -= k;
      if (fill_ < kBlock) return;
      Compress(buf_);
      fill_ = 0;
    }
    for (; n >= kBlock; p += kBlock, n -= kBlock) Compress(p);
    std::memcpy(buf_, p, n);
    fill_ = n;
  }

  void Final(uint8_t out[kDigest]) {
    const uint64_t bits = len_ * 8;
    const uint8_t one = 0x80, zero = 0;
    Update(&one, 1);
    while (fill_ != kBlock - 8) Update(&zero, 1);
    uint8_t lenb[8];
    for (int i = 0; i < 8; ++i) lenb[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    Update(lenb, 8);
    for (int i = 0; i < 8; ++i) {
      out[4 * i] = static_cast<uint8_t>(h_[i] >> 24);
      out[4 * i + 1] = static_cast<uint8_t>(h_[i] >> 16);
      out[4 * i + 2] = static_cast<uint8_t>(h_[i] >> 8);
      out[4 * i + 3] = static_cast<uint8_t>(h_[i]);
    }
  }

 private:
  static uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void Compress(const uint8_t* blk) {
    static const uint32_t K[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = static_cast<uint32_t>(blk[4 * i]) << 24 | static_cast<uint32_t>(blk[4 * i + 1]) << 16 |
             static_cast<uint32_t>(blk[4 * i + 2]) << 8 | blk[4 * i + 3];
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6],
             h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                          K[i] + w[i];
      const uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  uint32_t h_[8];
  uint64_t len_;
  uint8_t buf_[kBlock];
  size_t fill_;
};

// HMAC-SHA256 with the key's inner and outer pads hashed once: a session key
// MACs every frame of its connection, so each MAC costs two compressions of
// its own plus the message's.
class HmacSha256 {
 public:
  static constexpr size_t kMac = Sha256::kDigest;

  HmacSha256() = default;
  HmacSha256(const void* key, size_t n) { SetKey(key, n); }

  void SetKey(const void* key, size_t n) {
    uint8_t k[Sha256::kBlock] = {0};
    if (n > Sha256::kBlock) {
      Sha256 s;
      s.Update(key, n);
      s.Final(k);
    } else if (n) {
      std::memcpy(k, key, n);
    }
    uint8_t pad[Sha256::kBlock];
    for (size_t i = 0; i < Sha256::kBlock; ++i) pad[i] = k[i] ^ 0x36;
    inner_.Reset();
    inner_.Update(pad, sizeof pad);
    for (size_t i = 0; i < Sha256::kBlock; ++i) pad[i] = k[i] ^ 0x5c;
    outer_.Reset();
    outer_.Update(pad, sizeof pad);
  }

  // MAC of the concatenation a || b.
  void Mac(const void* a, size_t na, const void* b, size_t nb, uint8_t out[kMac]) const {
    Sha256 in = inner_;
    in.Update(a, na);
    if (nb) in.Update(b, nb);
    uint8_t ih[Sha256::kDigest];
    in.Final(ih);
    Sha256 out_h = outer_;
    out_h.Update(ih, sizeof ih);
    out_h.Final(out);
  }

  // Constant-time comparison of two MACs.
  static bool Equal(const uint8_t* x, const uint8_t* y) {
    uint8_t d = 0;
    for (size_t i = 0; i < kMac; ++i) d |= x[i] ^ y[i];
    return d == 0;
  }

 private:
  Sha256 inner_, outer_;
};

}  // namespace horovod_prio

#endif  // HOROVOD_PRIO_SCHEDULER_SHA256_H_
