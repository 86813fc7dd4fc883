use candle_core::{Device, Tensor};
use std::time::Instant;
fn main() {
    let dev = Device::Cpu;
    for &(m, k, n) in &[(1usize, 576usize, 1536usize), (8, 576, 1536), (64, 576, 1536), (8, 576, 49152), (1024, 576, 1536)] {
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let wt = w.t().unwrap().contiguous().unwrap();
        let reps = (2_000_000_000usize / (2 * m * k * n)).clamp(3, 2000);
        for (name, f) in [("x@w.t()", Box::new(|| x.matmul(&w.t().unwrap()).unwrap()) as Box<dyn Fn() -> Tensor>), ("x@wt", Box::new(|| x.matmul(&wt).unwrap()))] {
            f();
            let t = Instant::now();
            for _ in 0..reps { f(); }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            println!("{m}x{k}x{n} {name}: {:.3} ms, {:.1} GFLOP/s", s * 1e3, 2.0 * (m * k * n) as f64 / s / 1e9);
        }
    }
}
