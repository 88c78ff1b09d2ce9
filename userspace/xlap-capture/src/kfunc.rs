//! Kernel functions the capture object calls (kfuncs), which aya 0.14
//! cannot relocate: the BPF side emits each call with a placeholder BTF id
//! (`XLAP_KFUNC_*` in `bpf/xlap_abi.h`), and this module writes the running
//! kernel's id into the object before it is loaded, or, where the kernel
//! lacks the kfunc for tracing programs, a constant failure (the BPF side
//! then never takes that path: `xlap_config.have_dynptr` is 0).

use aya::util::KernelVersion;
use aya::Btf;
use aya_obj::btf::BtfKind;

/// `call` with src_reg = BPF_PSEUDO_KFUNC_CALL (2), dst 0, offset 0.
const KFUNC_CALL: [u8; 4] = [0x85, 0x20, 0x00, 0x00];
/// `r0 = -1` (BPF_ALU64 | BPF_MOV | BPF_K), the stand-in where the kfunc
/// is missing.
const MOV_R0_MINUS_1: [u8; 8] = [0xb7, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff];

/// The first kernel that lets tracing programs create skb dynptrs
/// (bpf_dynptr_from_skb registered for BPF_PROG_TYPE_TRACING).
pub const DYNPTR_TRACING_KERNEL: (u32, u32) = (6, 12);

/// An object file in 8-byte aligned memory (the ELF parser needs aligned
/// headers; a `Vec<u8>` gives no such promise).
pub struct AlignedObject {
    words: Vec<u64>,
    len: usize,
}

impl AlignedObject {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }

    fn copy_of(object: &[u8]) -> AlignedObject {
        let mut words = vec![0u64; object.len().div_ceil(8)];
        // SAFETY: the destination has room for object.len() bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                object.as_ptr(),
                words.as_mut_ptr().cast::<u8>(),
                object.len(),
            )
        };
        AlignedObject {
            words,
            len: object.len(),
        }
    }
}

/// The capture object with its skb-dynptr kfunc calls resolved, and
/// whether the kernel offers them (`None`: why not).
pub fn resolve_dynptr(object: &[u8], btf: &Btf) -> (AlignedObject, Result<u32, String>) {
    let id = dynptr_btf_id(btf);
    let mut out = AlignedObject::copy_of(object);
    let placeholder = xlap_abi::XLAP_KFUNC_DYNPTR_FROM_SKB.to_le_bytes();
    let mut call = [0u8; 8];
    call[..4].copy_from_slice(&KFUNC_CALL);
    call[4..].copy_from_slice(&placeholder);
    let replacement = match &id {
        Ok(id) => {
            let mut r = call;
            r[4..].copy_from_slice(&id.to_le_bytes());
            r
        }
        Err(_) => MOV_R0_MINUS_1,
    };
    patch_all(out.bytes_mut(), &call, &replacement);
    (out, id)
}

/// The BTF id of `bpf_dynptr_from_skb` if tracing programs may call it.
fn dynptr_btf_id(btf: &Btf) -> Result<u32, String> {
    let (major, minor) = DYNPTR_TRACING_KERNEL;
    if let Some(old) = crate::preflight::kernel_as().filter(|v| *v < DYNPTR_TRACING_KERNEL) {
        return Err(format!(
            "XLAP_KERNEL_AS={}.{} < {major}.{minor}: as there, tracing programs cannot read page fragments",
            old.0, old.1
        ));
    }
    let current = KernelVersion::current().map_err(|e| format!("kernel version unknown: {e}"))?;
    if current < KernelVersion::new(major as u8, minor as u8, 0) {
        return Err(format!(
            "kernel {current} < {major}.{minor}: tracing programs cannot read page fragments"
        ));
    }
    btf.id_by_type_name_kind("bpf_dynptr_from_skb", BtfKind::Func)
        .map_err(|e| format!("the kernel has no bpf_dynptr_from_skb kfunc: {e}"))
}

/// Replaces every 8-byte-aligned instruction equal to `from` (instructions
/// are 8-byte aligned in the object's sections, which are 8-byte aligned).
fn patch_all(bytes: &mut [u8], from: &[u8; 8], to: &[u8; 8]) -> usize {
    let mut n = 0;
    for chunk in bytes.chunks_exact_mut(8) {
        if chunk == from {
            chunk.copy_from_slice(to);
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_only_aligned_placeholder_calls() {
        let from = [0x85, 0x20, 0, 0, 0xef, 0xbe, 0xad, 0x7e];
        let to = [0x85, 0x20, 0, 0, 1, 2, 3, 4];
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&from);
        bytes.extend_from_slice(&[0u8; 8]);
        bytes.extend_from_slice(&[9, 9, 9, 9]);
        bytes.extend_from_slice(&from); // unaligned: left alone
        bytes.extend_from_slice(&[0u8; 4]);
        assert_eq!(patch_all(&mut bytes, &from, &to), 1);
        assert_eq!(&bytes[..8], &to);
        assert_eq!(&bytes[20..28], &from);
    }

    #[test]
    fn the_capture_object_calls_the_placeholder() {
        let object = crate::capture::capture_object();
        let placeholder = xlap_abi::XLAP_KFUNC_DYNPTR_FROM_SKB.to_le_bytes();
        let found = object
            .chunks_exact(8)
            .filter(|c| c[..4] == KFUNC_CALL && c[4..] == placeholder)
            .count();
        assert!(found > 0, "no placeholder kfunc call in capture.bpf.o");
    }
}
