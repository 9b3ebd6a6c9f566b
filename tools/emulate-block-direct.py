#!/usr/bin/env python3
# A CPU emulation of the direct-fragment K8 block kernel's lanes (gemv16_k8d in crates/kiln-cuda/kernels/gemv16.cu)
# for one super-block of 16 outputs and 16 activation rows: every lane's loads, nibble / 6-bit unpacking, scale
# bytes and code-sum words, fed through the PTX fragment layouts of mma.m16n8k32 and m16n8k16 (s8), against a
# plain integer dot of the dequantized codes. Checks the kernel's integers (the float steps are the GEMV's
# k8_step, shared code) without a GPU; the GPU self-test (tools/device-check.sh STEPS=selftest) checks the bits.
# Also the B16D_RING copies' placement in a warp's stages and the ring's wait/refill schedule.
# Needs numpy:  python3 tools/emulate-block-direct.py   (prints the mismatches; exits 1 on any)
import sys

import numpy as np
rng = np.random.default_rng(1)

def mma_16832(A, B):  # A[lane][4] words of 4 s8, B[lane][2] words -> C[lane][4]
    # PTX m16n8k32 s8: a0: row g, k 4t..4t+3; a1: row g+8; a2: row g, k 16+4t..; a3: row g+8, 16+4t..
    Am = np.zeros((16, 32), np.int64); Bm = np.zeros((32, 8), np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for r, (row, k0) in enumerate([(g, 4*t), (g+8, 4*t), (g, 16+4*t), (g+8, 16+4*t)]):
            Am[row, k0:k0+4] = sbytes(A[lane][r])
        for r, k0 in enumerate([4*t, 16+4*t]):
            Bm[k0:k0+4, g] = sbytes(B[lane][r])
    C = Am @ Bm
    return [[C[l>>2, 2*(l&3)], C[l>>2, 2*(l&3)+1], C[(l>>2)+8, 2*(l&3)], C[(l>>2)+8, 2*(l&3)+1]] for l in range(32)]

def mma_16816(A, B):  # A[lane][2], B[lane][1]
    Am = np.zeros((16, 16), np.int64); Bm = np.zeros((16, 8), np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        Am[g, 4*t:4*t+4] = sbytes(A[lane][0]); Am[g+8, 4*t:4*t+4] = sbytes(A[lane][1])
        Bm[4*t:4*t+4, g] = sbytes(B[lane][0])
    C = Am @ Bm
    return [[C[l>>2, 2*(l&3)], C[l>>2, 2*(l&3)+1], C[(l>>2)+8, 2*(l&3)], C[(l>>2)+8, 2*(l&3)+1]] for l in range(32)]

def sbytes(w):
    w &= 0xFFFFFFFF
    return [((w >> (8*i)) & 0xFF) - (256 if (w >> (8*i)) & 0x80 else 0) for i in range(4)]
def word(b):  # 4 bytes -> u32
    return int(b[0]) | int(b[1]) << 8 | int(b[2]) << 16 | int(b[3]) << 24
def byte_of(w, n): return (w >> (8*n)) & 0xFF

def k4_sm(q, j):
    if j < 4: return q[j] & 63, q[j+4] & 63
    return (q[j+4] & 0xF) | ((q[j-4] >> 6) << 4), (q[j+4] >> 4) | ((q[j] >> 6) << 4)

# ---- Q4_K: the record is d, dmin (4 bytes), 12 scale bytes, 128 quant bytes ----
recs = rng.integers(0, 256, (16, 144), dtype=np.int64)   # 16 outputs' records (d/dmin bytes unused here)
X = rng.integers(-127, 128, (16, 256), dtype=np.int64)   # 16 rows' K8 codes of the super-block
S = X.reshape(16, 8, 32).sum(axis=2)                     # code sums per 32
# reference integers
ref_is = np.zeros((16, 16), np.int64); ref_im = np.zeros((16, 16), np.int64)
for o in range(16):
    q = [int(v) for v in recs[o, 4:16]]
    codes = np.zeros(256, np.int64)
    for i in range(4):
        for b in range(32):
            byte = recs[o, 16 + 32*i + b]
            codes[64*i + b] = byte & 0xF; codes[64*i + 32 + b] = byte >> 4
    for j in range(8):
        sc, m = k4_sm(q, j)
        for r in range(16):
            ref_is[o, r] += sc * int(codes[32*j:32*j+32] @ X[r, 32*j:32*j+32])
            ref_im[o, r] += m * int(S[r, j])
# the kernel's lanes
def rec_word(o, off): return word(recs[o, off:off+4])
def xword(r, off): return word([v & 0xFF for v in X[r, off:off+4]])
is_ = [[[0]*4 for _ in range(2)] for _ in range(32)]
lo_A = []; hi_A = []
sc_l = []; mn_l = []
for lane in range(32):
    g, t = lane >> 2, lane & 3
    sc = []; mn = []
    for oh in range(2):
        o = g + 8*oh
        s0, s1, s2 = rec_word(o, 4), rec_word(o, 8), rec_word(o, 12)
        sc.append([s0 & 0x3F3F3F3F, (s2 & 0x0F0F0F0F) | ((s0 >> 2) & 0x30303030)])
        mn.append(((s2 >> 4) & 0x0F0F0F0F) | ((s1 >> 2) & 0x30303030) if t & 1 else s1 & 0x3F3F3F3F)
    sc_l.append(sc); mn_l.append(mn)
for j in range(8):
    A = []; Bs = [[], []]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        sh = 4*(j & 1); i = j >> 1
        q = [(rec_word(g + 8*oh, 16 + 32*i + 8*t), rec_word(g + 8*oh, 16 + 32*i + 8*t + 4)) for oh in range(2)]
        A.append([(q[0][0] >> sh) & 0x0F0F0F0F, (q[1][0] >> sh) & 0x0F0F0F0F, (q[0][1] >> sh) & 0x0F0F0F0F, (q[1][1] >> sh) & 0x0F0F0F0F])
        for nt in range(2):
            r = 8*nt + g
            Bs[nt].append([xword(r, 32*j + 8*t), xword(r, 32*j + 8*t + 4)])
    for nt in range(2):
        C = mma_16832(A, Bs[nt])
        for lane in range(32):
            s0 = byte_of(sc_l[lane][0][j >> 2], j & 3); s1 = byte_of(sc_l[lane][1][j >> 2], j & 3)
            for e in range(4):
                is_[lane][nt][e] += (s0 if e < 2 else s1) * C[lane][e]
# min term
def packed_word(r, t):
    vals = [int(S[r, 4*(t & 1) + i]) for i in range(4)]
    return word([((v >> 6) & 0xFF) if t >= 2 else (v & 63) for v in vals])
im_ = [[[0]*4 for _ in range(2)] for _ in range(32)]
for nt in range(2):
    Alo = []; Ahi = []; B = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        mn = mn_l[lane]
        Alo.append([mn[0] if t < 2 else 0, mn[1] if t < 2 else 0])
        Ahi.append([0 if t < 2 else mn[0], 0 if t < 2 else mn[1]])
        B.append([packed_word(8*nt + g, t)])
    clo = mma_16816(Alo, B); chi = mma_16816(Ahi, B)
    for lane in range(32):
        for e in range(4): im_[lane][nt][e] = clo[lane][e] + 64*chi[lane][e]
bad = 0
for lane in range(32):
    g, t = lane >> 2, lane & 3
    for nt in range(2):
        for e in range(4):
            o = g + 8*(e >> 1); r = 8*nt + 2*t + (e & 1)
            bad += is_[lane][nt][e] != ref_is[o, r]
            bad += im_[lane][nt][e] != ref_im[o, r]
print("Q4_K mismatches:", bad)
bad4 = bad

# ---- Q6_K: ql 128, qh 64, 16 signed scales (its d is stored elsewhere) ----
recs6 = rng.integers(0, 256, (16, 208), dtype=np.int64)
ref6 = np.zeros((16, 16), np.int64)
for o in range(16):
    ql, qh, scs = recs6[o, :128], recs6[o, 128:192], recs6[o, 192:208]
    scs = [v - 256 if v > 127 else v for v in scs]
    vals = np.zeros(256, np.int64); scale = np.zeros(256, np.int64)
    for h in range(2):
        for l in range(32):
            base = 128*h
            vals[base + l] = ((ql[64*h + l] & 0xF) | (((qh[32*h + l] >> 0) & 3) << 4)) - 32
            vals[base + l + 32] = ((ql[64*h + l + 32] & 0xF) | (((qh[32*h + l] >> 2) & 3) << 4)) - 32
            vals[base + l + 64] = ((ql[64*h + l] >> 4) | (((qh[32*h + l] >> 4) & 3) << 4)) - 32
            vals[base + l + 96] = ((ql[64*h + l + 32] >> 4) | (((qh[32*h + l] >> 6) & 3) << 4)) - 32
            isb = l // 16
            for kk in range(4): scale[base + l + 32*kk] = scs[8*h + isb + 2*kk]
    for r in range(16):
        for p in range(16):
            sl = slice(16*p, 16*p + 16)
            ref6[o, r] += scale[16*p] * int(vals[sl] @ X[r, sl])
def vsub4(v, b):
    return word([((byte_of(v, i) - byte_of(b, i)) & 0xFF) for i in range(4)])
def rw6(o, off): return word(recs6[o, off:off+4])
is6 = [[[0]*4 for _ in range(2)] for _ in range(32)]
for j in range(8):
    h, k = j >> 2, j & 3
    for c in range(2):
        A = []; Bs = [[], []]
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            aw = []
            for oh in range(2):
                o = g + 8*oh
                qlw = rw6(o, 64*h + 32*(k & 1) + 16*c + 4*t); qhw = rw6(o, 128 + 32*h + 16*c + 4*t)
                v = ((qlw >> (4*(k >> 1))) & 0x0F0F0F0F) | (((qhw >> (2*k)) & 0x03030303) << 4)
                aw.append(vsub4(v, 0x20202020))
            A.append(aw)
            for nt in range(2):
                r = 8*nt + g
                Bs[nt].append([xword(r, 32*j + 16*c + 4*t)])
        i = 8*h + 2*k + c
        for nt in range(2):
            C = mma_16816(A, Bs[nt])
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                s = [sbytes(rw6(g + 8*oh, 192 + 4*(i >> 2)))[i & 3] for oh in range(2)]
                for e in range(4): is6[lane][nt][e] += s[e >> 1] * C[lane][e]
bad = 0
for lane in range(32):
    g, t = lane >> 2, lane & 3
    for nt in range(2):
        for e in range(4):
            bad += is6[lane][nt][e] != ref6[g + 8*(e >> 1), 8*nt + 2*t + (e & 1)]
print("Q6_K mismatches:", bad)
bad6 = bad

# ---- B16D_RING: where each warp's cp.async copies put a super-block's records and d words, and the ring's
# schedule (b16d_ring, B16DRing). Matrices with an odd count of super-blocks and a partial last tile.
def ring_stage(W, REC, o0, n_out, nsb, sb):
    """The stage B16DRing<REC>::issue fills: chunk c = lane + 32 i -> output c / PIECES, piece c % PIECES."""
    pieces = REC // 16; ni = (16*pieces + 31) // 32
    st = np.full(16*REC, -1, np.int64)
    for lane in range(32):
        for i in range(ni):
            c = min(lane + 32*i, 16*pieces - 1); o, k = c // pieces, c % pieces
            if lane + 32*i < 16*pieces:
                row = min(o0 + o, n_out - 1)
                st[o*REC + 16*k:o*REC + 16*k + 16] = W[row, sb*REC + 16*k:sb*REC + 16*k + 16]
    return st
bad = 0
for REC in (144, 208):
    for n_out, nsb in ((37, 3), (16, 16), (21, 5)):
        W = rng.integers(0, 256, (n_out, nsb*REC), dtype=np.int64)
        dw = rng.integers(0, 65536, n_out*nsb, dtype=np.int64)
        dpad = np.concatenate([dw, np.zeros(len(dw) % 2, np.int64)])  # repack_parts' whole-word pad
        for o0 in range(0, n_out, 16):
            for sb in range(nsb):
                st = ring_stage(W, REC, o0, n_out, nsb, sb)
                for o in range(16):  # every byte load_w_ring reads is the record load_w would read
                    bad += int((st[o*REC:(o + 1)*REC] != W[min(o0 + o, n_out - 1), sb*REC:(sb + 1)*REC]).sum())
                if REC == 208:  # lane < 16 copies the aligned word holding output o0 + lane's d
                    for o in range(16):
                        ob = min(o0 + o, n_out - 1); idx = ob*nsb + sb; w0 = idx & ~1
                        bad += w0 + 1 >= len(dpad)
                        lo, hi = dpad[w0], dpad[min(w0 + 1, len(dpad) - 1)]
                        bad += (hi if idx & 1 else lo) != dw[idx]
# The schedule: S stages, S - 1 commit groups before the loop, one a step; wait_group S - 2 at step it, then the
# refill of stage (it + S - 1) % S, the stage step it - 1 read.
for S in (3, 4):
    for n_it in range(0, 14):
        stage_sb = [None]*S; stage_group = [None]*S; groups = 0; read_done = set()
        def issue(it):
            global bad
            s = it % S
            if stage_sb[s] is not None and stage_sb[s] not in read_done: bad += 1  # refilled before its read
            stage_sb[s], stage_group[s] = it, groups
        for s in range(S - 1):
            if s < n_it: issue(s)
            groups += 1
        for it in range(n_it):
            complete = groups - (S - 2)           # groups 0 .. complete - 1 are in after wait_group S - 2
            if stage_sb[it % S] != it or stage_group[it % S] >= complete: bad += 1
            if it + S - 1 < n_it: issue(it + S - 1)
            groups += 1
            read_done.add(it)                     # load_w_ring reads stage it % S
print("ring mismatches:", bad)
sys.exit(1 if bad or bad4 or bad6 else 0)
