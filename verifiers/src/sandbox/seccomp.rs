//! The seccomp filter every sandboxed process runs under: defence in depth behind the
//! namespaces, rlimits and dropped capabilities.
//!
//! [`DENIED`] is the one list of refused system calls. Each is refused with an error (`EPERM`;
//! `ENOSYS` for `clone3`), never by killing the process, so a program that tries one gets a
//! clean `OSError` it can report. Everything not listed is allowed: the filter removes kernel
//! attack surface and escape routes that graders and tools never use, it is not an allow-list.
//!
//! The filter is compiled with `seccompiler` into classic BPF, one program per errno, and handed
//! to bubblewrap with `--add-seccomp-fd`. bwrap installs it (with `no_new_privs`) after it has
//! built the sandbox's namespaces and mounts, right before it executes the harness, so bwrap
//! itself may still mount while nothing started inside the sandbox can. A system call from
//! another architecture (a 32-bit `int 0x80` on x86_64) kills the process: the filter checks
//! the architecture first, as every seccompiler program does.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use thiserror::Error;

/// One system call the filter refuses.
#[derive(Debug, Clone, Copy)]
pub struct DeniedCall {
    /// The call's name, as in `man 2`.
    pub name: &'static str,
    /// Why graders and tools never need it.
    pub why: &'static str,
    /// The errno the call fails with.
    pub errno: i32,
    /// The call's number on this architecture (`None` where the architecture lacks it).
    pub number: Option<i64>,
    /// When set, the call is refused only when its first argument has any of these bits set.
    pub any_flag_of: Option<u64>,
}

/// The `clone` flags that create namespaces (`CLONE_NEWTIME` cannot be passed to `clone`:
/// its bit is part of the exit signal there, so only `unshare` and `clone3` could use it).
pub const CLONE_NEW_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;

/// The x32 ABI's bit in a system call number (x86_64 only).
const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// x32 numbers that differ from `X32_SYSCALL_BIT | x86_64 number` for calls in [`DENIED`].
const X32_OWN_NUMBERS: &[(&str, i64)] = &[
    ("ptrace", X32_SYSCALL_BIT | 521),
    ("kexec_load", X32_SYSCALL_BIT | 528),
    ("process_vm_readv", X32_SYSCALL_BIT | 539),
    ("process_vm_writev", X32_SYSCALL_BIT | 540),
];

/// A call refused with `EPERM` whatever its arguments.
const fn deny(name: &'static str, number: i64, why: &'static str) -> DeniedCall {
    DeniedCall { name, why, errno: libc::EPERM, number: Some(number), any_flag_of: None }
}

/// Why the mount family is refused (one reason for the whole family).
const MOUNTS: &str = "changes the file-system view the sandbox is built from (read-only root, \
                      private /work and /tmp); bwrap mounts everything before the filter applies";
/// Why the host-administration calls are refused.
const ADMIN: &str = "administers the host kernel; no grader or tool administers a machine";

/// Every system call the filter refuses, with the reason. Docs (docs/security.md) and the
/// adversarial suite (`verifiers/tests/data/adversarial/seccomp/`) follow this list.
pub const DENIED: &[DeniedCall] = &[
    // Other processes' memory and descriptors: the harness holds the verdict pipe and nonce.
    deny("ptrace", libc::SYS_ptrace, "reads and writes other processes' memory and registers"),
    deny("process_vm_readv", libc::SYS_process_vm_readv, "reads another process's memory"),
    deny("process_vm_writev", libc::SYS_process_vm_writev, "writes another process's memory"),
    deny("pidfd_getfd", libc::SYS_pidfd_getfd, "copies a descriptor out of another process"),
    // Namespaces: bwrap creates them before the filter applies; nothing inside needs new ones,
    // and a new user namespace hands its creator every capability inside it (the first step
    // of many kernel exploits).
    deny("unshare", libc::SYS_unshare, "creates namespaces (a user namespace grants capabilities)"),
    deny("setns", libc::SYS_setns, "joins another namespace"),
    DeniedCall {
        name: "clone",
        why: "only with a CLONE_NEW* flag (creates namespaces); fork and threads stay allowed",
        errno: libc::EPERM,
        number: Some(libc::SYS_clone),
        any_flag_of: Some(CLONE_NEW_FLAGS),
    },
    DeniedCall {
        name: "clone3",
        why: "its flags sit in memory a filter cannot read; ENOSYS makes glibc fall back to clone",
        errno: libc::ENOSYS,
        number: Some(libc::SYS_clone3),
        any_flag_of: None,
    },
    // Mounts and the file-system view.
    deny("mount", libc::SYS_mount, MOUNTS),
    deny("umount2", libc::SYS_umount2, MOUNTS),
    deny("pivot_root", libc::SYS_pivot_root, MOUNTS),
    deny("chroot", libc::SYS_chroot, MOUNTS),
    deny("fsopen", libc::SYS_fsopen, MOUNTS),
    deny("fsconfig", libc::SYS_fsconfig, MOUNTS),
    deny("fsmount", libc::SYS_fsmount, MOUNTS),
    deny("fspick", libc::SYS_fspick, MOUNTS),
    deny("move_mount", libc::SYS_move_mount, MOUNTS),
    deny("open_tree", libc::SYS_open_tree, MOUNTS),
    deny("mount_setattr", libc::SYS_mount_setattr, MOUNTS),
    deny(
        "open_by_handle_at",
        libc::SYS_open_by_handle_at,
        "opens files by handle, past the mount view (the 'shocker' container escape)",
    ),
    deny(
        "name_to_handle_at",
        libc::SYS_name_to_handle_at,
        "makes the handles open_by_handle_at opens",
    ),
    // Kernel attack surface that no grader uses.
    deny("keyctl", libc::SYS_keyctl, "the kernel keyring: not per sandbox, a history of exploits"),
    deny(
        "add_key",
        libc::SYS_add_key,
        "the kernel keyring: not per sandbox, a history of exploits",
    ),
    deny(
        "request_key",
        libc::SYS_request_key,
        "the kernel keyring: not per sandbox, a history of exploits",
    ),
    deny(
        "bpf",
        libc::SYS_bpf,
        "loads programs into the kernel, a common privilege-escalation route",
    ),
    deny(
        "perf_event_open",
        libc::SYS_perf_event_open,
        "performance counters: side channels and a long list of kernel exploits",
    ),
    deny(
        "userfaultfd",
        libc::SYS_userfaultfd,
        "stalls kernel page faults at will, the usual tool for winning kernel races",
    ),
    deny(
        "io_uring_setup",
        libc::SYS_io_uring_setup,
        "io_uring: a kernel interface with a long exploit history; Python never uses it",
    ),
    deny("io_uring_enter", libc::SYS_io_uring_enter, "io_uring (see io_uring_setup)"),
    deny("io_uring_register", libc::SYS_io_uring_register, "io_uring (see io_uring_setup)"),
    deny("lookup_dcookie", libc::SYS_lookup_dcookie, "kernel profiling (removed in Linux 6.8)"),
    // Host administration.
    deny("kexec_load", libc::SYS_kexec_load, ADMIN),
    deny("kexec_file_load", libc::SYS_kexec_file_load, ADMIN),
    deny("init_module", libc::SYS_init_module, ADMIN),
    deny("finit_module", libc::SYS_finit_module, ADMIN),
    deny("delete_module", libc::SYS_delete_module, ADMIN),
    deny("reboot", libc::SYS_reboot, ADMIN),
    deny("swapon", libc::SYS_swapon, ADMIN),
    deny("swapoff", libc::SYS_swapoff, ADMIN),
    deny("acct", libc::SYS_acct, ADMIN),
    DeniedCall {
        name: "iopl",
        why: "direct access to hardware I/O ports (x86 only)",
        errno: libc::EPERM,
        number: IOPL,
        any_flag_of: None,
    },
    DeniedCall {
        name: "ioperm",
        why: "direct access to hardware I/O ports (x86 only)",
        errno: libc::EPERM,
        number: IOPERM,
        any_flag_of: None,
    },
];

#[cfg(target_arch = "x86_64")]
const IOPL: Option<i64> = Some(libc::SYS_iopl);
#[cfg(not(target_arch = "x86_64"))]
const IOPL: Option<i64> = None;
#[cfg(target_arch = "x86_64")]
const IOPERM: Option<i64> = Some(libc::SYS_ioperm);
#[cfg(not(target_arch = "x86_64"))]
const IOPERM: Option<i64> = None;

/// The filter could not be built or handed over.
#[derive(Debug, Clone, Error)]
pub enum SeccompError {
    /// This architecture has no filter (seccompiler supports x86_64, aarch64 and riscv64).
    #[error("no seccomp filter for architecture {0}")]
    Architecture(String),
    /// seccompiler refused the rules or could not compile them.
    #[error("cannot compile the seccomp filter: {0}")]
    Compile(String),
    /// The compiled filter could not be written to a memory file for bwrap.
    #[error("cannot pass the seccomp filter to bwrap ({what}): {message}")]
    Io {
        /// The step that failed.
        what: &'static str,
        /// The OS error.
        message: String,
    },
}

fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> SeccompError {
    move |e| SeccompError::Io { what, message: e.to_string() }
}

/// The rules of one denied call: none (always refused) or one rule per flag bit.
fn rules_of(call: &DeniedCall) -> Result<Vec<SeccompRule>, SeccompError> {
    let Some(flags) = call.any_flag_of else { return Ok(Vec::new()) };
    let compile = |e: seccompiler::BackendError| SeccompError::Compile(e.to_string());
    (0..64)
        .map(|bit| 1u64 << bit)
        .filter(|bit| flags & bit != 0)
        .map(|bit| {
            // the kernel reads clone's flags as 32 bits; so does the comparison
            let condition =
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(bit), bit)
                    .map_err(compile)?;
            SeccompRule::new(vec![condition]).map_err(compile)
        })
        .collect()
}

/// Compiles [`DENIED`] for this machine's architecture (the numbers in it are this target's):
/// one BPF program per errno, each allowing what it does not refuse, as the raw
/// `struct sock_filter` arrays bwrap reads.
pub fn compile() -> Result<Vec<Vec<u8>>, SeccompError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SeccompError::Architecture(std::env::consts::ARCH.into()))?;
    let mut by_errno: BTreeMap<i32, BTreeMap<i64, Vec<SeccompRule>>> = BTreeMap::new();
    for call in DENIED {
        let Some(number) = call.number else { continue };
        let rules = by_errno.entry(call.errno).or_default();
        rules.insert(number, rules_of(call)?);
        if arch == TargetArch::x86_64 {
            // the x32 ABI shares the x86_64 audit arch; its numbers carry the x32 bit
            rules.insert(number | X32_SYSCALL_BIT, rules_of(call)?);
            for &(name, x32) in X32_OWN_NUMBERS {
                if name == call.name {
                    rules.insert(x32, rules_of(call)?);
                }
            }
        }
    }
    by_errno
        .into_iter()
        .map(|(errno, rules)| {
            let filter = SeccompFilter::new(
                rules,
                SeccompAction::Allow,
                SeccompAction::Errno(errno as u32),
                arch,
            )
            .map_err(|e| SeccompError::Compile(e.to_string()))?;
            let program: BpfProgram = filter
                .try_into()
                .map_err(|e: seccompiler::BackendError| SeccompError::Compile(e.to_string()))?;
            Ok(program
                .iter()
                .flat_map(|i| {
                    let mut bytes = Vec::with_capacity(8);
                    bytes.extend_from_slice(&i.code.to_ne_bytes());
                    bytes.push(i.jt);
                    bytes.push(i.jf);
                    bytes.extend_from_slice(&i.k.to_ne_bytes());
                    bytes
                })
                .collect())
        })
        .collect()
}

/// The programs for this machine's architecture, compiled once.
fn programs() -> Result<&'static [Vec<u8>], SeccompError> {
    static PROGRAMS: OnceLock<Result<Vec<Vec<u8>>, SeccompError>> = OnceLock::new();
    PROGRAMS.get_or_init(compile).as_ref().map(Vec::as_slice).map_err(Clone::clone)
}

/// One close-on-exec memory file per program, each holding the program and positioned at its
/// start, for bwrap's `--add-seccomp-fd` (the spawn code moves them to fixed numbers, which
/// clears close-on-exec for bwrap alone; bwrap reads and closes them before the harness runs).
pub fn filter_files() -> Result<Vec<OwnedFd>, SeccompError> {
    programs()?
        .iter()
        .map(|program| {
            // SAFETY: memfd_create takes a NUL-terminated name and flags; on success we own the fd.
            let fd = unsafe { libc::memfd_create(c"verity-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                return Err(io_error("memfd_create")(io::Error::last_os_error()));
            }
            // SAFETY: fd is a fresh descriptor nobody else owns.
            let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
            file.write_all(program).map_err(io_error("write"))?;
            file.seek(SeekFrom::Start(0)).map_err(io_error("seek"))?;
            Ok(OwnedFd::from(file))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_into_one_program_per_errno() {
        let programs = compile().expect("the filter compiles");
        assert_eq!(programs.len(), 2, "one program for EPERM, one for ENOSYS");
        for program in &programs {
            assert!(!program.is_empty() && program.len() % 8 == 0);
            // a classic BPF program holds at most 4096 instructions
            assert!(program.len() / 8 <= 4096);
        }
    }

    #[test]
    fn filter_files_hold_the_programs_from_their_start() {
        use std::io::Read;
        let files = filter_files().expect("memory files");
        let programs = compile().expect("the filter compiles");
        for (fd, program) in files.into_iter().zip(&programs) {
            let mut bytes = Vec::new();
            File::from(fd).read_to_end(&mut bytes).expect("readable");
            assert_eq!(&bytes, program);
        }
    }

    #[test]
    fn names_are_unique_and_every_call_says_why() {
        let mut names: Vec<&str> = DENIED.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DENIED.len());
        assert!(DENIED.iter().all(|c| !c.why.is_empty()));
    }
}
