//! Where builtin workloads compute: the CPU or a CUDA device (agents built
//! with the `cuda` feature), and the dtypes they compute in.

use candle_core::{DType, Device};
use orch_protocol::TaskSpec;

/// Where a builtin workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Cuda(usize),
}

impl DeviceKind {
    pub fn name(self) -> String {
        match self {
            DeviceKind::Cpu => "cpu".to_string(),
            DeviceKind::Cuda(0) => "cuda".to_string(),
            DeviceKind::Cuda(n) => format!("cuda:{n}"),
        }
    }
}

/// `f32`, `bf16`, `f16` (and their common spellings).
pub(crate) fn parse_dtype(s: &str, workload: &str) -> Result<DType, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" | "float32" | "fp32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" | "fp16" | "half" => Ok(DType::F16),
        _ => Err(format!(
            "unknown {workload} dtype `{s}`: known dtypes are f32, bf16, f16"
        )),
    }
}

pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "f32",
    }
}

/// `cpu`, `cuda`, `cuda:<n>`; CUDA only in agents built with it.
pub(crate) fn parse_device(s: &str, workload: &str) -> Result<DeviceKind, String> {
    let lower = s.trim().to_ascii_lowercase();
    let kind = match lower.as_str() {
        "cpu" => DeviceKind::Cpu,
        "cuda" | "gpu" => DeviceKind::Cuda(0),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => DeviceKind::Cuda(n),
            _ => {
                return Err(format!(
                    "unknown {workload} device `{s}`: known devices are cpu, cuda, cuda:<n>"
                ))
            }
        },
    };
    if matches!(kind, DeviceKind::Cuda(_)) && !cfg!(feature = "cuda") {
        return Err(format!(
            "{workload} device `{s}` needs an agent built with the `cuda` feature"
        ));
    }
    Ok(kind)
}

/// CUDA when the cell asks for a GPU and the agent can use one, else the CPU.
pub fn default_device(task: &TaskSpec) -> DeviceKind {
    let wants_gpu = !task.gpu.is_cpu();
    if wants_gpu && cfg!(feature = "cuda") {
        DeviceKind::Cuda(0)
    } else {
        DeviceKind::Cpu
    }
}

/// Open the device. On CUDA, the default memory pool keeps what it frees
/// (release threshold = max): otherwise every synchronize hands freed memory
/// back to the driver and the next allocation maps it again, which measured
/// 0.33-0.40x PyTorch's copy bandwidth and 0.89x its matmul throughput.
pub fn open_device(kind: DeviceKind) -> candle_core::Result<Device> {
    match kind {
        DeviceKind::Cpu => Ok(Device::Cpu),
        DeviceKind::Cuda(n) => {
            let device = Device::new_cuda(n)?;
            #[cfg(feature = "cuda")]
            keep_freed_memory(n)?;
            Ok(device)
        }
    }
}

#[cfg(feature = "cuda")]
fn default_pool(
    ordinal: usize,
) -> candle_core::Result<candle_core::cuda_backend::cudarc::driver::sys::CUmemoryPool> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let fail = |what: &str, r: sys::CUresult| candle_core::Error::Msg(format!("{what} failed: {r:?}"));
    let ordinal =
        i32::try_from(ordinal).map_err(|_| candle_core::Error::Msg("device ordinal too large".into()))?;
    // SAFETY: plain driver calls on a device that `Device::new_cuda` has
    // initialised; every pointer is to a local that outlives the call.
    unsafe {
        let mut dev: sys::CUdevice = 0;
        let r = sys::cuDeviceGet(&mut dev, ordinal);
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(fail("cuDeviceGet", r));
        }
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let r = sys::cuDeviceGetDefaultMemPool(&mut pool, dev);
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(fail("cuDeviceGetDefaultMemPool", r));
        }
        Ok(pool)
    }
}

#[cfg(feature = "cuda")]
fn keep_freed_memory(ordinal: usize) -> candle_core::Result<()> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let pool = default_pool(ordinal)?;
    let mut threshold: u64 = u64::MAX;
    // SAFETY: `pool` is the device's default pool; the value outlives the call.
    let r = unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(candle_core::Error::Msg(format!(
            "cuMemPoolSetAttribute failed: {r:?}"
        )));
    }
    Ok(())
}

/// The most bytes the device's memory pool has had allocated (every tensor
/// candle holds) since the last reset; with `reset`, starts a new count. The
/// counterpart of PyTorch's `torch.cuda.max_memory_allocated`. `None` on the
/// CPU or where the driver does not say.
pub fn pool_peak_bytes(kind: DeviceKind, reset: bool) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let DeviceKind::Cuda(n) = kind {
        use candle_core::cuda_backend::cudarc::driver::sys;
        let pool = default_pool(n).ok()?;
        let mut value: u64 = 0;
        // SAFETY: `pool` is the device's default pool; `value` outlives the calls.
        unsafe {
            let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
            let r = sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast());
            if r != sys::CUresult::CUDA_SUCCESS {
                return None;
            }
            if reset {
                let mut zero: u64 = 0;
                sys::cuMemPoolSetAttribute(pool, attr, (&mut zero as *mut u64).cast());
            }
        }
        return Some(value);
    }
    let _ = (kind, reset);
    None
}

/// Free bytes on a CUDA device (what a cell can still allocate), from the driver.
pub fn free_bytes(device: &Device) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        let (free, _total) = d.cuda_stream().context().mem_get_info().ok()?;
        return Some(free as u64);
    }
    let _ = device;
    None
}
