//! Weight sizes from safetensors headers (8-byte little-endian header length,
//! then a JSON header naming each tensor's dtype and shape). Reads only the
//! header, never the tensors.

use std::io::Read;
use std::path::Path;

/// Bytes of one element of a safetensors dtype.
fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 1,
        "F4" | "F6_E2M3" | "F6_E3M2" => 1, // packed types: upper bound
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" | "C64" => 8,
        _ => return None,
    })
}

/// Parameters and bytes of the tensors in one safetensors file.
pub fn tensor_bytes(path: &Path) -> std::io::Result<(u64, u64)> {
    let mut f = std::fs::File::open(path)?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return Err(std::io::Error::other(format!(
            "header of {len} bytes is implausible"
        )));
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header)?;
    let json: serde_json::Value = serde_json::from_slice(&header).map_err(std::io::Error::other)?;
    let mut params = 0u64;
    let mut bytes = 0u64;
    if let Some(map) = json.as_object() {
        for (name, t) in map {
            if name == "__metadata__" {
                continue;
            }
            let numel: u64 = t["shape"]
                .as_array()
                .map(|s| s.iter().filter_map(|d| d.as_u64()).product())
                .unwrap_or(0);
            params += numel;
            match t["data_offsets"]
                .as_array()
                .map(|o| (o[0].as_u64(), o[1].as_u64()))
            {
                Some((Some(a), Some(b))) => bytes += b.saturating_sub(a),
                _ => bytes += numel * t["dtype"].as_str().and_then(dtype_bytes).unwrap_or(4),
            }
        }
    }
    Ok((params, bytes))
}

/// Sum over every `.safetensors` file under `dir` (a snapshot folder).
pub fn weights_in_dir(dir: &Path) -> std::io::Result<(u64, u64, usize)> {
    let mut totals = (0, 0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().and_then(|e| e.to_str()) == Some("safetensors") {
                let (p, b) = tensor_bytes(&path)?;
                totals.0 += p;
                totals.1 += b;
                totals.2 += 1;
            }
        }
    }
    Ok(totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_header_only() {
        let tmp = tempfile::tempdir().unwrap();
        let header = br#"{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[4],"data_offsets":[12,28]},"__metadata__":{"format":"pt"}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend(std::iter::repeat_n(0u8, 28));
        std::fs::write(tmp.path().join("m.safetensors"), &bytes).unwrap();
        assert_eq!(tensor_bytes(&tmp.path().join("m.safetensors")).unwrap(), (10, 28));
        assert_eq!(weights_in_dir(tmp.path()).unwrap(), (10, 28, 1));
    }
}

/// Share of GPU memory the weights may take; the rest is headroom for
/// activations, KV cache and the runtime.
pub const WEIGHTS_SHARE: f64 = 0.85;

/// Whether weights of `bytes` fit in `count` GPUs of `gib_per_gpu` each, and
/// if not, the smallest count (up to `max_count`) that would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    Fits,
    NeedsCount(u32),
    TooLarge,
}

pub fn fit(bytes: u64, gib_per_gpu: u32, count: u32, max_count: u32) -> Fit {
    let per_gpu = gib_per_gpu as f64 * (1u64 << 30) as f64 * WEIGHTS_SHARE;
    let need = (bytes as f64 / per_gpu).ceil().max(1.0) as u32;
    if need <= count {
        Fit::Fits
    } else if need <= max_count {
        Fit::NeedsCount(need)
    } else {
        Fit::TooLarge
    }
}

#[cfg(test)]
mod fit_tests {
    use super::*;

    #[test]
    fn fits_with_headroom() {
        let gib = 1u64 << 30;
        assert_eq!(fit(40 * gib, 80, 1, 8), Fit::Fits);
        assert_eq!(fit(75 * gib, 80, 1, 8), Fit::NeedsCount(2));
        assert_eq!(fit(140 * gib, 80, 2, 8), Fit::NeedsCount(3));
        assert_eq!(fit(2000 * gib, 80, 8, 8), Fit::TooLarge);
    }
}
