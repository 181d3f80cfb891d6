//! Prototype of a batched 4-bit tile (x86-64 AVX-512 VNNI, 16-bit activations as two signed
//! 8-bit digits, MLX group 32) with its lanes across weight rows instead of across columns.
//!
//! The weights sit in panels of 16 rows: per group of 32 columns, 4 chunks of 64 bytes, lane `l`
//! of a chunk holding row `l`'s codes of 8 columns (low nibbles the first 4, high nibbles the
//! next 4), then each group's 16 scales and biases as f32. Each `vpdpbusd` multiplies a chunk's
//! nibble plane by one broadcast dword of an activation row's digits: every lane is one output, so
//! a group's integer sums stay in their lanes (no horizontal sums, no factor windows per tile), and
//! once a group, per (activation row, panel): a shift and add joins the two digits' sums, one
//! convert, one `vscalefps` by the activation group's unit, and two FMAs (scale, bias times the
//! activation group's sum). Per 512 multiply-adds: 16 `vpdpbusd` and about 6 other vector
//! instructions, against 16 and 16 in the current tile (`quant/vnni.rs`) plus its per-tile work.
//!
//! It checks its result against an f64 evaluation of the same arithmetic and its tile shapes
//! against each other (bit for bit), then times, alternating, `QuantizedMatrix::matmul` (q4 g32,
//! `ActivationPrecision::Int16`, the detected kernel) and the prototype on one thread, in cycles
//! per (weight row, activation row, 128 columns) at an assumed 3.6 GHz (the ratio is what counts).
//! Weight copies rotate (argument 4) so that they stream from DRAM as a model's do.
use std::arch::x86_64::*;
use std::time::Instant;

const G: usize = 32;

struct Panels { n: usize, k: usize, codes: Vec<u8>, scales: Vec<f32>, biases: Vec<f32> }
// codes: [panel][group][chunk 4][16 lanes][4 bytes]; scales/biases: [panel][group][16]

struct Acts { m: usize, k: usize, hi: Vec<i8>, lo: Vec<i8>, exps: Vec<f32>, gsum: Vec<f32> }
// hi/lo: [m][k] ; exps/gsum: [m][k/G]

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const MR: usize, const NP: usize>(w: &Panels, a: &Acts, r0: usize, p0: usize, out: &mut [f32]) {
    let groups = w.k / G;
    let nib = _mm512_set1_epi8(0x0f);
    let mut total = [[_mm512_setzero_ps(); NP]; MR];
    for g in 0..groups {
        let mut ah = [[_mm512_setzero_si512(); NP]; MR];
        let mut al = [[_mm512_setzero_si512(); NP]; MR];
        for c in 0..4 {
            let mut lo = [_mm512_setzero_si512(); NP];
            let mut hi = [_mm512_setzero_si512(); NP];
            for q in 0..NP {
                let p = w.codes.as_ptr().add((((p0 + q) * groups + g) * 4 + c) * 64);
                let d = _mm512_loadu_si512(p as *const _);
                lo[q] = _mm512_and_si512(d, nib);
                hi[q] = _mm512_and_si512(_mm512_srli_epi32::<4>(d), nib);
            }
            for r in 0..MR {
                let col = (r0 + r) * a.k + g * G + c * 8;
                let h0 = _mm512_set1_epi32(*(a.hi.as_ptr().add(col) as *const i32));
                let h1 = _mm512_set1_epi32(*(a.hi.as_ptr().add(col + 4) as *const i32));
                let l0 = _mm512_set1_epi32(*(a.lo.as_ptr().add(col) as *const i32));
                let l1 = _mm512_set1_epi32(*(a.lo.as_ptr().add(col + 4) as *const i32));
                for q in 0..NP {
                    ah[r][q] = _mm512_dpbusd_epi32(ah[r][q], lo[q], h0);
                    ah[r][q] = _mm512_dpbusd_epi32(ah[r][q], hi[q], h1);
                    al[r][q] = _mm512_dpbusd_epi32(al[r][q], lo[q], l0);
                    al[r][q] = _mm512_dpbusd_epi32(al[r][q], hi[q], l1);
                }
            }
        }
        for q in 0..NP {
            let f = ((p0 + q) * groups + g) * 16;
            let s = _mm512_loadu_ps(w.scales.as_ptr().add(f));
            let b = _mm512_loadu_ps(w.biases.as_ptr().add(f));
            for r in 0..MR {
                let ga = (r0 + r) * groups + g;
                let sum = _mm512_add_epi32(_mm512_slli_epi32::<8>(ah[r][q]), al[r][q]);
                let v = _mm512_scalef_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(*a.exps.get_unchecked(ga)));
                total[r][q] = _mm512_fmadd_ps(s, v, total[r][q]);
                total[r][q] = _mm512_fmadd_ps(b, _mm512_set1_ps(*a.gsum.get_unchecked(ga)), total[r][q]);
            }
        }
    }
    for r in 0..MR { for q in 0..NP {
        _mm512_storeu_ps(out.as_mut_ptr().add((r0 + r) * w.n + (p0 + q) * 16), total[r][q]);
    }}
}

fn run<const MR: usize, const NP: usize>(w: &Panels, a: &Acts, out: &mut [f32]) {
    let panels = w.n / 16;
    // panels in groups of 8, each meeting all rows (the arranged rows stay in L1/L2)
    let mut p = 0;
    while p < panels {
        let pe = (p + 8).min(panels);
        let mut r = 0;
        while r + MR <= a.m {
            let mut q = p;
            while q + NP <= pe { unsafe { tile::<MR, NP>(w, a, r, q, out) }; q += NP; }
            r += MR;
        }
        p = pe;
    }
}

fn main() {
    let mut s = 88172645463325252u64;
    let mut rnd = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).map_or(6144, |v| v.parse().unwrap());
    let k: usize = args.get(2).map_or(2048, |v| v.parse().unwrap());
    let m: usize = args.get(3).map_or(8, |v| v.parse().unwrap());
    let copies: usize = args.get(4).map_or(1, |v| v.parse().unwrap());
    let groups = k / G;
    let ws: Vec<Panels> = (0..copies).map(|_| Panels { n, k, codes: (0..n * k / 2).map(|_| rnd() as u8).collect(),
        scales: (0..n * groups).map(|_| (rnd() % 1000) as f32 * 1e-5).collect(),
        biases: (0..n * groups).map(|_| (rnd() % 1000) as f32 * -1e-5).collect() }).collect();
    let w = Panels { n, k, codes: (0..n * k / 2).map(|_| rnd() as u8).collect(),
        scales: (0..n * groups).map(|_| (rnd() % 1000) as f32 * 1e-5).collect(),
        biases: (0..n * groups).map(|_| (rnd() % 1000) as f32 * -1e-5).collect() };
    let a = Acts { m, k, hi: (0..m * k).map(|_| rnd() as i8 / 2).collect(), lo: (0..m * k).map(|_| rnd() as i8).collect(),
        exps: (0..m * groups).map(|_| -((rnd() % 20) as f32)).collect(), gsum: (0..m * groups).map(|_| (rnd() % 100) as f32).collect() };
    let mut out = vec![0f32; m * n];
    // The tile shapes that fit m rows (MR <= m), the first of them checked against a scalar
    // reference of the same arithmetic and the others against it bit for bit.
    type Run = fn(&Panels, &Acts, &mut [f32]);
    let shapes: Vec<(&str, usize, Run)> = vec![
        ("8x1", 8, run::<8, 1>),
        ("4x2", 4, run::<4, 2>),
        ("2x4", 2, run::<2, 4>),
        ("1x4", 1, run::<1, 4>),
    ];
    let shapes: Vec<(&str, Run)> = shapes
        .into_iter()
        .filter(|&(_, mr, _)| mr <= m && m % mr == 0)
        .map(|(name, _, f)| (name, f))
        .collect();
    {
        shapes[0].1(&w, &a, &mut out);
        let code = |j: usize, col: usize| {
            let (p, l, g, c, b) = (j / 16, j % 16, col / G, (col % G) / 8, col % 8);
            let byte = w.codes[(((p * groups + g) * 4 + c) * 64) + l * 4 + (b % 4)];
            if b < 4 { byte & 15 } else { byte >> 4 }
        };
        let mut worst = 0f32;
        for r in 0..m { for j in (0..n).step_by(97) {
            let mut t = 0f64;
            for g in 0..groups {
                let isum: i64 = (g * G..(g + 1) * G).map(|c| code(j, c) as i64 * (a.hi[r * k + c] as i64 * 256 + a.lo[r * k + c] as i64)).sum();
                t += w.scales[(j / 16 * groups + g) * 16 + j % 16] as f64 * (isum as f64) * 2f64.powf(a.exps[r * groups + g] as f64)
                    + w.biases[(j / 16 * groups + g) * 16 + j % 16] as f64 * a.gsum[r * groups + g] as f64;
            }
            worst = worst.max(((out[r * n + j] as f64 - t).abs() / (1.0 + t.abs())) as f32);
        }}
        for (name, v) in &shapes[1..] {
            let mut o2 = vec![0f32; m * n];
            v(&w, &a, &mut o2);
            assert!(o2.iter().zip(&out).all(|(x, y)| x.to_bits() == y.to_bits()), "tile {name} differs");
        }
        println!("prototype vs f64 reference: worst relative error {worst:.2e} (tile shapes bit-identical)");
    }
    // existing kernel, q4 g32, i16, one thread
    let wf: Vec<f32> = (0..n * k).map(|_| (rnd() % 2001) as f32 * 1e-3 - 1.0).collect();
    let qms: Vec<_> = (0..copies).map(|_| moshi_kernels::QuantizedMatrix::quantize(&wf, n, k, 4, G).unwrap()).collect();
    let xs: Vec<f32> = (0..m * k).map(|_| (rnd() % 2001) as f32 * 1e-3 - 1.0).collect();
    moshi_kernels::set_activation_precision(moshi_kernels::ActivationPrecision::Int16);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let mut y = vec![0f32; m * n];
    let blocks = (n * m * k / 128) as f64;
    let ghz = 3.6e9;
    pool.install(|| {
        for round in 0..5 {
            let reps = 24;
            let t0 = Instant::now();
            for i in 0..reps { qms[i % copies].matmul(&xs, m, &mut y); }
            let cur = t0.elapsed().as_secs_f64() / reps as f64;
            let mut line = format!("n{n} k{k} m{m} r{round}: cycles/pair-block at 3.6 GHz: current {:.2}", cur * ghz / blocks);
            for (name, f) in &shapes {
                let t0 = Instant::now();
                for i in 0..reps { f(&ws[i % copies], &a, &mut out); }
                let t = t0.elapsed().as_secs_f64() / reps as f64;
                line += &format!(", panels {name} {:.2}", t * ghz / blocks);
            }
            println!("{line}");
        }
    });
    std::hint::black_box(&out);
}
