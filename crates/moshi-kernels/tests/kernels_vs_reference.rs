//! Fast kernels (every variant this CPU runs, plus the automatic choice) against the scalar
//! reference on a grid of shapes, bit widths and group sizes.
//!
//! Tolerance: both sides compute `Σ_j x_j · w_j` in f32 with `w_j = q_j·s + b`, in different
//! orders (and the SIMD kernels round `q·s + b` once, with an FMA). The standard bound for
//! recursive summation gives `|fast - ref| ≤ (cols + 4) · ε · Σ_j |x_j| (|q_j s| + |b|)`.

use moshi_kernels::{
    round_activations_i8, round_activations_two_digits, ActivationPrecision, Kernel, QuantPanels,
    QuantizedMatrix, ScaleFormat, Q8_0_BLOCK, Q8_0_BLOCK_BYTES, SUPPORTED_BITS,
    SUPPORTED_GROUP_SIZES,
};
use moshi_test_support::XorShift64Star;

/// `y[m, rows] = x[m, cols] · Wᵀ` with the activations at a precision: `(precision, x, m, y)`.
type ProductFn = Box<dyn Fn(ActivationPrecision, &[f32], usize, &mut [f32])>;

/// One way this CPU multiplies a matrix: a kernel on MLX's row layout, or the panel layout.
struct Product {
    name: String,
    run: ProductFn,
}

/// Every way this CPU multiplies `w`: each kernel it runs on the row layout, and the AVX-512
/// VNNI kernel on `w` rearranged into panels where it reads them (4-bit and 8-bit codes).
fn products(w: &QuantizedMatrix) -> Vec<Product> {
    let mut all: Vec<Product> = Kernel::available()
        .into_iter()
        .map(|kernel| {
            let w = w.clone();
            Product {
                name: kernel.name().to_string(),
                run: Box::new(move |precision, x, m, y| {
                    w.matmul_with(kernel, precision, x, m, y).unwrap()
                }),
            }
        })
        .collect();
    if let Ok(panels) = QuantPanels::from_matrix(w.clone(), Kernel::Avx512Vnni) {
        all.push(Product {
            name: "avx512vnni on panels".to_string(),
            run: Box::new(move |precision, x, m, y| panels.matmul_with(precision, x, m, y)),
        });
    }
    all
}

fn bf16(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

fn random_matrix(
    rng: &mut XorShift64Star,
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
) -> QuantizedMatrix {
    let words = rows * cols * bits as usize / 32;
    let groups = rows * cols / group_size;
    let codes = (0..words).map(|_| rng.next_u64() as u32).collect();
    let scales = (0..groups)
        .map(|_| bf16(rng.uniform(-0.05, 0.05)))
        .collect();
    let biases = (0..groups).map(|_| bf16(rng.uniform(-0.5, 0.5))).collect();
    QuantizedMatrix::new(rows, cols, bits, group_size, codes, scales, biases).unwrap()
}

/// Per-output error bound `(cols + 4) ε Σ_j |x_j| (|q_j s| + |b|)`, layout `[m, rows]`.
fn error_bounds(w: &QuantizedMatrix, x: &[f32], m: usize) -> Vec<f32> {
    let (rows, cols, gs) = (w.rows(), w.cols(), w.group_size());
    let mut out = vec![0f32; m * rows];
    for r in 0..rows {
        for i in 0..m {
            let mut s = 0f64;
            for j in 0..cols {
                let g = r * (cols / gs) + j / gs;
                let (sc, b) = (
                    w.scale_format().to_f32(w.scales()[g]) as f64,
                    w.scale_format().to_f32(w.biases()[g]) as f64,
                );
                s += (x[i * cols + j] as f64).abs() * ((w.code(r, j) as f64 * sc).abs() + b.abs());
            }
            out[i * rows + r] = ((cols + 4) as f64 * f32::EPSILON as f64 * s) as f32;
        }
    }
    out
}

/// Largest |a - b| / bound over all outputs (≤ 1 means within tolerance).
fn worst_ratio(a: &[f32], b: &[f32], bounds: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .zip(bounds)
        .map(|((p, q), t)| (p - q).abs() / t.max(f32::MIN_POSITIVE))
        .fold(0f32, f32::max)
}

fn check(
    rng: &mut XorShift64Star,
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
    m: usize,
) {
    let x: Vec<f32> = (0..m * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
    check_with(rng, rows, cols, bits, group_size, m, &x);
}

fn check_with(
    rng: &mut XorShift64Star,
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
    m: usize,
    x: &[f32],
) {
    let w = random_matrix(rng, rows, cols, bits, group_size);
    let what = format!("rows {rows} cols {cols} bits {bits} group {group_size} m {m}");
    check_matrix(&w, m, x, &what);
}

/// Every kernel this CPU runs, and the automatic choice, against the scalar reference on `w`.
fn check_matrix(w: &QuantizedMatrix, m: usize, x: &[f32], what: &str) {
    let rows = w.rows();
    let x = x.to_vec();
    let mut want = vec![0f32; m * rows];
    w.matmul_reference(&x, m, &mut want);
    let bounds = error_bounds(w, &x, m);
    for product in products(w) {
        let mut got = vec![f32::NAN; m * rows];
        (product.run)(ActivationPrecision::Exact, &x, m, &mut got);
        let ratio = worst_ratio(&got, &want, &bounds);
        assert!(
            ratio <= 1.0,
            "{} kernel, {what}: error {ratio} x the bound",
            product.name
        );
    }
    let mut got = vec![f32::NAN; m * rows];
    if m == 1 {
        w.matvec(&x, &mut got);
    } else {
        w.matmul(&x, m, &mut got);
    }
    assert!(
        worst_ratio(&got, &want, &bounds) <= 1.0,
        "auto kernel, {what}"
    );
}

#[test]
fn every_kernel_matches_reference_on_shape_grid() {
    let mut rng = XorShift64Star::new(0x1234_5678_9abc_def1);
    for bits in SUPPORTED_BITS {
        for group_size in SUPPORTED_GROUP_SIZES {
            for rows in [1, 7, 33] {
                // one group, and an odd number of groups (3 × 32 = 96 columns is not a multiple of 64)
                for cols in [group_size, 3 * group_size] {
                    for m in [1, 2, 3, 5, 7] {
                        check(&mut rng, rows, cols, bits, group_size, m);
                    }
                }
            }
        }
    }
}

#[test]
fn activations_of_every_magnitude_stay_within_the_bound() {
    // The AVX-512 kernel pre-scales activations by powers of two down to 2^-28 and regroups the
    // sum per group. Rows mixing magnitudes from 1e-29 to 1e29, and rows of tiny values only
    // (where the bound is tiny too, so any precision lost to the pre-scaling would show), must
    // stay as exact as the other kernels.
    let mut rng = XorShift64Star::new(99);
    for (bits, group_size) in [(4, 32), (8, 64), (4, 128), (8, 32)] {
        let cols = 4 * 128 + group_size;
        for (lo, hi) in [(-29.0, 29.0), (-29.0, -25.0)] {
            let x: Vec<f32> = (0..2 * cols)
                .map(|_| {
                    let magnitude = 10f32.powf(rng.uniform(lo, hi));
                    if rng.uniform(-1.0, 1.0) < 0.0 {
                        -magnitude
                    } else {
                        magnitude
                    }
                })
                .collect();
            check_with(&mut rng, 9, cols, bits, group_size, 1, &x[..cols]);
            check_with(&mut rng, 9, cols, bits, group_size, 2, &x);
        }
    }
}

#[test]
fn threaded_split_matches_reference() {
    // Large enough to run on two threads (of the pool's 3) in several units of rows, the last
    // one short, shared out by a balanced region.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let mut rng = XorShift64Star::new(42);
    pool.install(|| {
        for (bits, group_size) in [(4, 32), (8, 64), (4, 128), (6, 64)] {
            for m in [1, 3] {
                check(&mut rng, 1001, 512, bits, group_size, m);
            }
        }
    });
}

#[test]
fn bound_detects_a_single_wrong_code() {
    // The tolerance must be tight enough to catch one flipped code (the kind of bug a wrong
    // nibble order or group offset produces).
    let mut rng = XorShift64Star::new(7);
    let w = random_matrix(&mut rng, 5, 256, 4, 32);
    let x: Vec<f32> = (0..256).map(|_| rng.uniform(0.5, 1.0)).collect();
    let mut codes = w.codes().to_vec();
    codes[3 * 32 + 5] ^= 0x0000_0f00; // row 3, one nibble
    let broken = QuantizedMatrix::new(
        5,
        256,
        4,
        32,
        codes,
        w.scales().to_vec(),
        w.biases().to_vec(),
    )
    .unwrap();
    let (mut want, mut got) = (vec![0f32; 5], vec![0f32; 5]);
    w.matmul_reference(&x, 1, &mut want);
    for product in products(&broken) {
        (product.run)(ActivationPrecision::Exact, &x, 1, &mut got);
        assert!(
            worst_ratio(&got, &want, &error_bounds(&w, &x, 1)) > 1.0,
            "{}",
            product.name
        );
    }
}

#[test]
fn matvec_equals_dequantized_dot_on_exact_values() {
    // Small integers: every product and sum is exact in f32, so all kernels agree bit for bit.
    let codes: Vec<u32> = (0..4 * 64 / 8)
        .map(|i| 0x7654_3210u32.rotate_left(4 * (i % 8) as u32))
        .collect();
    let w =
        QuantizedMatrix::new(4, 64, 4, 32, codes, vec![bf16(2.0); 8], vec![bf16(-3.0); 8]).unwrap();
    let x: Vec<f32> = (0..64).map(|j| (j % 5) as f32 - 2.0).collect();
    let mut want = vec![0f32; 4];
    let mut row = vec![0f32; 64];
    for (r, v) in want.iter_mut().enumerate() {
        w.dequantize_row_f32(r, &mut row);
        *v = row.iter().zip(&x).map(|(a, b)| a * b).sum();
    }
    for product in products(&w) {
        let mut got = vec![0f32; 4];
        (product.run)(ActivationPrecision::Exact, &x, 1, &mut got);
        assert_eq!(got, want, "{}", product.name);
    }
}

#[test]
fn matvec_is_bit_identical_to_each_row_of_a_matmul() {
    // The matrix-vector path handles several weight rows per pass; per row it must do exactly the
    // arithmetic of the matrix-matrix path, so a row of `x` gives the same bits either way: in one
    // tile of activation rows (2) and in panels of weight rows met by several tiles (9); with
    // exact and with 16-bit activations (8-bit codes take the integer kernels only with these).
    let mut rng = XorShift64Star::new(7);
    let cases = [
        (4, 32, 2),
        (8, 64, 2),
        (4, 64, 2),
        (8, 32, 2),
        (4, 32, 9),
        (8, 32, 9),
    ];
    for ((bits, group_size, m), precision) in cases
        .into_iter()
        .flat_map(|c| [ActivationPrecision::Exact, ActivationPrecision::Int16].map(|p| (c, p)))
    {
        for rows in [1, 5, 13, 64] {
            let cols = 5 * group_size;
            let w = random_matrix(&mut rng, rows, cols, bits, group_size);
            let xs: Vec<f32> = (0..m * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
            for product in products(&w) {
                let mut pair = vec![0f32; m * rows];
                (product.run)(precision, &xs, m, &mut pair);
                for (i, x) in xs.chunks_exact(cols).enumerate() {
                    let mut single = vec![f32::NAN; rows];
                    (product.run)(precision, x, 1, &mut single);
                    let want = &pair[i * rows..(i + 1) * rows];
                    assert!(
                        single
                            .iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{} {precision:?} q{bits}g{group_size} rows {rows} activation row {i}: \
                         {single:?} vs {want:?}",
                        product.name
                    );
                }
            }
        }
    }
}

#[test]
fn many_panels_match_reference_and_batched_bits() {
    // Enough weight rows for the single-row product to run in streams of panels on two threads
    // (75 panels of 16 rows, the last one partial: three equal spans of panels, a tile taking
    // one panel of each, and panels left over), at the depformer's 1024 columns: within the
    // bound, and the same bits as each row of a two-row product, which takes the tiles of
    // adjacent panels.
    let mut rng = XorShift64Star::new(13);
    let (rows, cols) = (75 * 16 - 3, 1024);
    for (bits, group_size) in [(4, 64), (4, 32), (8, 64)] {
        check(&mut rng, rows, cols, bits, group_size, 1);
        let w = random_matrix(&mut rng, rows, cols, bits, group_size);
        let xs: Vec<f32> = (0..2 * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
        for precision in [ActivationPrecision::Exact, ActivationPrecision::Int16] {
            for product in products(&w) {
                let mut two = vec![0f32; 2 * rows];
                (product.run)(precision, &xs, 2, &mut two);
                for (i, x) in xs.chunks_exact(cols).enumerate() {
                    let mut single = vec![f32::NAN; rows];
                    (product.run)(precision, x, 1, &mut single);
                    let want = &two[i * rows..(i + 1) * rows];
                    let same = single
                        .iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{} {precision:?} q{bits}g{group_size} {rows}x{cols} activation row {i}",
                        product.name
                    );
                }
            }
        }
    }
}

#[test]
fn long_rows_match_reference_and_single_row_bits() {
    // 11264 columns (the 7B gating-out width; its activations no longer fit in L1) and widths
    // whose chunk count is odd: every activation-row count matches the reference within the
    // bound and gives the same bits per row as the single-row product.
    let mut rng = XorShift64Star::new(11);
    for (bits, group_size, cols) in [(4, 32, 11264), (8, 64, 11264), (4, 64, 5056), (8, 32, 4128)] {
        for m in [1, 2, 5] {
            check(&mut rng, 9, cols, bits, group_size, m);
        }
        let w = random_matrix(&mut rng, 9, cols, bits, group_size);
        let xs: Vec<f32> = (0..5 * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
        for product in products(&w) {
            let mut five = vec![0f32; 5 * 9];
            (product.run)(ActivationPrecision::Exact, &xs, 5, &mut five);
            for (i, x) in xs.chunks_exact(cols).enumerate() {
                let mut single = vec![f32::NAN; 9];
                (product.run)(ActivationPrecision::Exact, x, 1, &mut single);
                let want = &five[i * 9..(i + 1) * 9];
                assert!(
                    single
                        .iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} q{bits}g{group_size} cols {cols} row {i}: {single:?} vs {want:?}",
                    product.name
                );
            }
        }
    }
}

#[test]
fn non_finite_activations_give_non_finite_outputs_in_every_kernel() {
    // The VNNI kernel cannot hold NaN or infinities in fixed point and hands such products to
    // the f32 kernel; every kernel must agree with the reference on which outputs are finite.
    let mut rng = XorShift64Star::new(5);
    for (bits, group_size) in [(4, 32), (8, 64)] {
        let w = random_matrix(&mut rng, 6, 256, bits, group_size);
        for bad in [f32::NAN, f32::INFINITY] {
            let mut x: Vec<f32> = (0..2 * 256).map(|_| rng.uniform(-1.0, 1.0)).collect();
            x[256 + 100] = bad;
            let mut want = vec![0f32; 2 * 6];
            w.matmul_reference(&x, 2, &mut want);
            for product in products(&w) {
                let mut got = vec![0f32; 2 * 6];
                (product.run)(ActivationPrecision::Exact, &x, 2, &mut got);
                let finite: Vec<bool> = got.iter().map(|v| v.is_finite()).collect();
                let want_finite: Vec<bool> = want.iter().map(|v| v.is_finite()).collect();
                assert_eq!(finite, want_finite, "{} q{bits} {bad}", product.name);
                assert!(finite[..6].iter().all(|f| *f) && !finite[6..].iter().any(|f| *f));
            }
        }
    }
}

#[test]
fn a_row_the_fixed_point_cannot_hold_leaves_the_other_rows_of_the_batch_alone() {
    // Batched sessions share one product: a row with a NaN, an infinity or only subnormal values
    // (which the VNNI kernel hands to the f32 kernel) must not change the bits of the other rows.
    let mut rng = XorShift64Star::new(17);
    let (rows, cols) = (11, 512);
    for (bits, group_size) in [(4, 32), (4, 64), (8, 64)] {
        let w = random_matrix(&mut rng, rows, cols, bits, group_size);
        for bad in [f32::NAN, f32::INFINITY, 1e-40] {
            let mut xs: Vec<f32> = (0..3 * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
            if bad < 1.0 {
                xs[cols..2 * cols].iter_mut().for_each(|v| *v *= bad);
            } else {
                xs[cols + 7] = bad;
            }
            for product in products(&w) {
                let mut three = vec![0f32; 3 * rows];
                (product.run)(ActivationPrecision::Exact, &xs, 3, &mut three);
                for (i, x) in xs.chunks_exact(cols).enumerate() {
                    let mut single = vec![f32::NAN; rows];
                    (product.run)(ActivationPrecision::Exact, x, 1, &mut single);
                    let want = &three[i * rows..(i + 1) * rows];
                    assert!(
                        single
                            .iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{} q{bits}g{group_size} bad {bad} row {i}: {single:?} vs {want:?}",
                        product.name
                    );
                }
            }
        }
    }
}

/// The values a rounded activation precision multiplies (the scalar rule of each).
fn rounded_activations(
    precision: ActivationPrecision,
    x: &[f32],
    m: usize,
    cols: usize,
    group_size: usize,
) -> Vec<f32> {
    match precision {
        ActivationPrecision::Int8 => round_activations_i8(x, m, cols, group_size),
        ActivationPrecision::Int16 => round_activations_two_digits(x, m, cols, group_size),
        ActivationPrecision::Exact => unreachable!("exact activations are not rounded"),
    }
}

/// Every kernel with rounded activations (8-bit or 16-bit) against the scalar reference of the
/// same rounding: the exact product of the dequantized weights with the rounded `x`, within the
/// f32 summation bound on those values (the integer kernels' sums of codes and rounded values are
/// exact; only their f32 accumulation differs from the reference's).
#[allow(clippy::too_many_arguments)] // the shape under test, spelled out as in `check`
fn check_rounded(
    precision: ActivationPrecision,
    rng: &mut XorShift64Star,
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
    x: &[f32],
    m: usize,
) {
    let w = random_matrix(rng, rows, cols, bits, group_size);
    let what = format!("{precision}, rows {rows} cols {cols} bits {bits} group {group_size} m {m}");
    check_rounded_matrix(precision, &w, x, m, &what);
}

/// [`check_rounded`] on the given matrix.
fn check_rounded_matrix(
    precision: ActivationPrecision,
    w: &QuantizedMatrix,
    x: &[f32],
    m: usize,
    what: &str,
) {
    let (rows, cols, group_size) = (w.rows(), w.cols(), w.group_size());
    let rounded = rounded_activations(precision, x, m, cols, group_size);
    let mut want = vec![0f32; m * rows];
    w.matmul_reference(&rounded, m, &mut want);
    let bounds = error_bounds(w, &rounded, m);
    for product in products(w) {
        let mut got = vec![f32::NAN; m * rows];
        (product.run)(precision, x, m, &mut got);
        let ratio = worst_ratio(&got, &want, &bounds);
        assert!(
            ratio <= 1.0,
            "{} kernel, {what}: error {ratio} x the bound",
            product.name
        );
        // Each row of a batch gets the bits it gets alone.
        if m > 1 {
            let mut alone = vec![f32::NAN; rows];
            (product.run)(precision, &x[cols..2 * cols], 1, &mut alone);
            assert_eq!(
                &got[rows..2 * rows],
                &alone[..],
                "{} kernel, {what}",
                product.name
            );
        }
    }
}

/// [`check_rounded`] on the shape grid, then on magnitudes from 1e-29 to 1e29 in a row (groups
/// far apart).
fn rounded_activations_match_the_reference(precision: ActivationPrecision) {
    let mut rng = XorShift64Star::new(0x0123_4567_89ab_cdef);
    for bits in SUPPORTED_BITS {
        for group_size in SUPPORTED_GROUP_SIZES {
            for rows in [1, 7, 33] {
                for cols in [group_size, 3 * group_size, 4 * 128 + group_size] {
                    for m in [1, 2, 5] {
                        let x: Vec<f32> = (0..m * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
                        check_rounded(precision, &mut rng, rows, cols, bits, group_size, &x, m);
                    }
                }
            }
        }
    }
    for (bits, group_size) in [(4, 32), (4, 64), (8, 64)] {
        let cols = 4 * 128 + group_size;
        let x: Vec<f32> = (0..2 * cols)
            .map(|_| {
                let magnitude = 10f32.powf(rng.uniform(-29.0, 29.0));
                if rng.uniform(-1.0, 1.0) < 0.0 {
                    -magnitude
                } else {
                    magnitude
                }
            })
            .collect();
        check_rounded(precision, &mut rng, 9, cols, bits, group_size, &x, 2);
    }
}

#[test]
fn every_kernel_with_8_bit_activations_matches_the_reference_of_the_same_rounding() {
    rounded_activations_match_the_reference(ActivationPrecision::Int8);
}

#[test]
fn every_kernel_with_16_bit_activations_matches_the_reference_of_the_same_rounding() {
    rounded_activations_match_the_reference(ActivationPrecision::Int16);
}

#[test]
fn eight_bit_activations_round_each_group_and_leave_rows_they_cannot_hold() {
    let cols = 128;
    let mut x: Vec<f32> = (0..2 * cols).map(|j| (j as f32 * 0.37).sin()).collect();
    x[cols + 3] = f32::NAN;
    let rounded = round_activations_i8(&x, 2, cols, 64);
    // Row 0 rounded (not all values survive), row 1 copied as it is (NaN included).
    assert!(rounded[..cols].iter().zip(&x).any(|(r, v)| r != v));
    assert!(rounded[..cols]
        .iter()
        .zip(&x)
        .all(|(r, v)| (r - v).abs() <= 1.0 / 254.0 + 1e-7));
    assert!(rounded[cols + 3].is_nan());
    assert_eq!(rounded[cols..cols + 3], x[cols..cols + 3]);
    let w = random_matrix(&mut XorShift64Star::new(7), 5, cols, 4, 64);
    for product in products(&w) {
        for precision in [ActivationPrecision::Int8, ActivationPrecision::Int16] {
            let mut y = vec![0f32; 2 * 5];
            (product.run)(precision, &x, 2, &mut y);
            assert!(y[..5].iter().all(|v| v.is_finite()) && y[5..].iter().all(|v| v.is_nan()));
        }
    }
}

/// Random GGUF q8_0 blocks: f16 scales of either sign over many binades (subnormal ones
/// included), codes over the whole `i8` range.
fn random_q8_0_blocks(rng: &mut XorShift64Star, rows: usize, cols: usize) -> Vec<u8> {
    let mut blocks = Vec::new();
    for _ in 0..rows * cols / Q8_0_BLOCK {
        let magnitude = 2f32.powf(rng.uniform(-26.0, 3.0));
        let d = if rng.uniform(-1.0, 1.0) < 0.0 {
            -magnitude
        } else {
            magnitude
        };
        blocks.extend(half::f16::from_f32(d).to_le_bytes());
        blocks.extend((0..Q8_0_BLOCK).map(|_| rng.next_u64() as u8));
    }
    blocks
}

/// The q8_0 matrix unpacks to exactly `d · q` (the f16 scale widened, times the signed code, in
/// f32: at most 19 significant bits, so exact), element by element, for subnormal scales too.
#[test]
fn q8_0_dequantizes_to_the_exact_block_values() {
    let mut rng = XorShift64Star::new(0x0808);
    let (rows, cols) = (5, 96);
    let blocks = random_q8_0_blocks(&mut rng, rows, cols);
    let w = QuantizedMatrix::from_q8_0(rows, cols, &blocks).unwrap();
    assert_eq!(w.scale_format(), ScaleFormat::F16);
    let got = w.dequantize_f32();
    for (b, block) in blocks.chunks_exact(Q8_0_BLOCK_BYTES).enumerate() {
        let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
        for (j, &q) in block[2..].iter().enumerate() {
            let want = d * (q as i8) as f32;
            let at = b * Q8_0_BLOCK + j;
            // Equal values (a zero code gives +0 where `d · 0` may be -0).
            assert_eq!(got[at], want, "element {at}: d {d}, q {q}");
        }
    }
}

/// Every kernel this CPU runs (the lane kernels widen the f16 scales their own way) against the
/// scalar reference on q8_0 matrices: one block, odd block counts, long rows, batches.
#[test]
fn every_kernel_matches_reference_on_q8_0() {
    let mut rng = XorShift64Star::new(0x0800);
    for rows in [1, 7, 33] {
        for cols in [32, 96, 4096 + 32] {
            let w =
                QuantizedMatrix::from_q8_0(rows, cols, &random_q8_0_blocks(&mut rng, rows, cols))
                    .unwrap();
            for m in [1, 2, 5] {
                let x: Vec<f32> = (0..m * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
                check_matrix(&w, m, &x, &format!("q8_0 rows {rows} cols {cols} m {m}"));
            }
        }
    }
}

/// Every kernel with 16-bit and 8-bit activations against the reference of the same rounding on
/// q8_0 matrices (f16 scales: the VNNI kernel's 8-bit codes widen them in its factor windows).
#[test]
fn every_kernel_with_rounded_activations_matches_the_reference_on_q8_0() {
    let mut rng = XorShift64Star::new(0x0802);
    for precision in [ActivationPrecision::Int16, ActivationPrecision::Int8] {
        for rows in [1, 7, 33] {
            for cols in [32, 96, 4096 + 32] {
                let blocks = random_q8_0_blocks(&mut rng, rows, cols);
                let w = QuantizedMatrix::from_q8_0(rows, cols, &blocks).unwrap();
                for m in [1, 2, 5] {
                    let x: Vec<f32> = (0..m * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
                    let what = format!("{precision}, q8_0 rows {rows} cols {cols} m {m}");
                    check_rounded_matrix(precision, &w, &x, m, &what);
                }
            }
        }
    }
}

/// The product on integer-valued activations is exact, so every kernel gives `Σ d · q · x` to
/// the bit (checks the widened scales themselves, not only the error bound).
#[test]
fn q8_0_products_are_exact_on_exact_values() {
    let mut rng = XorShift64Star::new(0x0801);
    let (rows, cols) = (9, 256);
    let mut blocks = random_q8_0_blocks(&mut rng, rows, cols);
    // Scales that are multiples of 2^-20 with few bits, so every partial sum is exact in f32.
    for (i, block) in blocks.chunks_exact_mut(Q8_0_BLOCK_BYTES).enumerate() {
        let d = ((i % 7) as f32 - 3.0) * 2f32.powi(-20) + 2f32.powi(-16);
        block[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
    }
    let w = QuantizedMatrix::from_q8_0(rows, cols, &blocks).unwrap();
    let x: Vec<f32> = (0..cols).map(|j| ((j * 5 % 9) as f32) - 4.0).collect();
    let deq = w.dequantize_f32();
    let want: Vec<f32> = deq
        .chunks_exact(cols)
        .map(|row| {
            row.iter()
                .zip(&x)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum::<f64>() as f32
        })
        .collect();
    for product in products(&w) {
        let mut got = vec![f32::NAN; rows];
        (product.run)(ActivationPrecision::Exact, &x, 1, &mut got);
        assert_eq!(got, want, "{} kernel", product.name);
    }
}

#[test]
fn q8_0_refuses_bad_blocks() {
    let mut blocks = vec![0u8; 2 * Q8_0_BLOCK_BYTES];
    let err = QuantizedMatrix::from_q8_0(1, 64, &blocks[..Q8_0_BLOCK_BYTES]).unwrap_err();
    assert!(err.to_string().contains("expected 68"), "{err}");
    blocks[Q8_0_BLOCK_BYTES..Q8_0_BLOCK_BYTES + 2]
        .copy_from_slice(&half::f16::INFINITY.to_le_bytes());
    let err = QuantizedMatrix::from_q8_0(1, 64, &blocks).unwrap_err();
    assert!(err.to_string().contains("block 1 has scale inf"), "{err}");
    blocks[Q8_0_BLOCK_BYTES..Q8_0_BLOCK_BYTES + 2]
        .copy_from_slice(&half::f16::from_f32(600.0).to_le_bytes());
    let err = QuantizedMatrix::from_q8_0(1, 64, &blocks).unwrap_err();
    assert!(err.to_string().contains("scale 600"), "{err}");
    let err = QuantizedMatrix::from_q8_0(1, 48, &blocks).unwrap_err();
    assert!(err.to_string().contains("48"), "{err}");
}
