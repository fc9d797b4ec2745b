//! The file-system seam: every byte the journal reads or writes goes through [`Storage`] and
//! [`SegmentFile`], so that tests can swap the real disk for [`FaultyStorage`], which fails
//! writes and fsyncs the way a full or dying disk does.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Linux `ENOSPC`: no space left on device.
pub const ENOSPC: i32 = 28;
/// Linux `EIO`: input/output error.
pub const EIO: i32 = 5;

/// How [`Storage::open_file`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    ReadWrite,
    /// Read and write; the file must not exist yet.
    CreateNew,
}

/// One entry of a directory listing.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: String,
    pub is_dir: bool,
}

/// Directory-level operations.
pub trait Storage: Send + Sync + fmt::Debug {
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Lists a directory. Names that are not valid UTF-8 are returned lossily converted, which
    /// is enough for the journal to treat them as foreign files.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>>;
    fn open_file(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn SegmentFile>>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes creations, renames and removals inside `path` durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
}

/// Positional file operations. Positional I/O keeps reads and appends independent of a shared
/// cursor, so a reader never disturbs the writer.
pub trait SegmentFile: Send + Sync + fmt::Debug {
    fn size_bytes(&self) -> io::Result<u64>;
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`: the data and the size are durable when this returns Ok.
    fn sync_data(&mut self) -> io::Result<()>;
    fn set_len(&mut self, len_bytes: u64) -> io::Result<()>;

    /// A second handle on the same open file that can `fdatasync` it without `&mut` access
    /// to this one, so the journal can fsync outside the lock its appends take (see
    /// `Journal::prepare_sync`). None (the default) means this file cannot: the journal then
    /// fsyncs it in place, under the lock.
    fn sync_handle(&self) -> io::Result<Option<Box<dyn SyncHandle>>> {
        Ok(None)
    }

    /// Reads the whole file. Refuses files larger than `len_bytes_max` rather than allocating
    /// whatever a damaged size says.
    fn read_all(&self, len_bytes_max: u64) -> io::Result<Vec<u8>> {
        let len = self.size_bytes()?;
        if len > len_bytes_max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("file is {len} bytes, larger than the limit of {len_bytes_max} bytes"),
            ));
        }
        let mut buf = vec![0u8; len as usize];
        self.read_exact_at(&mut buf, 0)?;
        Ok(buf)
    }
}

/// A handle that only fsyncs; it covers every write made through the file it came from
/// before `sync_data` starts.
pub trait SyncHandle: Send + Sync + fmt::Debug {
    /// `fdatasync` of the file this handle came from.
    fn sync_data(&self) -> io::Result<()>;
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealStorage;

#[derive(Debug)]
struct RealFile(fs::File);

impl Storage for RealStorage {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            out.push(DirEntry {
                name: entry.file_name().to_string_lossy().into_owned(),
                is_dir: entry.file_type()?.is_dir(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn open_file(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn SegmentFile>> {
        let mut options = fs::OpenOptions::new();
        match mode {
            OpenMode::Read => options.read(true),
            OpenMode::ReadWrite => options.read(true).write(true),
            OpenMode::CreateNew => options.read(true).write(true).create_new(true),
        };
        Ok(Box::new(RealFile(options.open(path)?)))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        fs::File::open(path)?.sync_all()
    }
}

impl SegmentFile for RealFile {
    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.0, buf, offset)
    }

    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.0, buf, offset)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn set_len(&mut self, len_bytes: u64) -> io::Result<()> {
        self.0.set_len(len_bytes)
    }

    fn sync_handle(&self) -> io::Result<Option<Box<dyn SyncHandle>>> {
        // A dup'ed descriptor shares the open file description, so fdatasync on it flushes
        // the same file's data.
        Ok(Some(Box::new(RealSyncHandle(self.0.try_clone()?))))
    }
}

#[derive(Debug)]
struct RealSyncHandle(fs::File);

impl SyncHandle for RealSyncHandle {
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}

/// What [`FaultyStorage`] should break. Shared between the storage, its files and the test
/// through an `Arc`, so a test can arm a fault after the journal is open.
#[derive(Debug, Default)]
pub struct Faults {
    plan: Mutex<FaultPlan>,
    bytes_written: AtomicU64,
    syncs: AtomicU64,
    sync_handles: AtomicU64,
}

#[derive(Debug, Default, Clone)]
struct FaultPlan {
    /// Writes succeed for this many more bytes, then write a partial buffer and fail.
    write_budget_bytes: Option<u64>,
    write_errno: i32,
    /// Every file or directory sync fails with this errno.
    sync_errno: Option<i32>,
    /// Every rename fails with this errno.
    rename_errno: Option<i32>,
}

impl Faults {
    /// After `bytes` more bytes, writes fail with `errno` (a disk that fills up writes the part
    /// that fits, then reports `ENOSPC`).
    pub fn fail_writes_after(&self, bytes: u64, errno: i32) {
        let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        plan.write_budget_bytes = Some(bytes);
        plan.write_errno = errno;
    }

    /// Every later file or directory sync fails with `errno`.
    pub fn fail_syncs(&self, errno: i32) {
        self.plan
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sync_errno = Some(errno);
    }

    /// Every later rename fails with `errno`; used to simulate a crash between writing a
    /// temporary file and renaming it into place.
    pub fn fail_renames(&self, errno: i32) {
        self.plan
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rename_errno = Some(errno);
    }

    /// Disarms every fault.
    pub fn clear(&self) {
        *self.plan.lock().unwrap_or_else(|e| e.into_inner()) = FaultPlan::default();
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.load(Ordering::Relaxed)
    }

    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// How many fsync handles the files handed out (each a descriptor of its own).
    pub fn sync_handles(&self) -> u64 {
        self.sync_handles.load(Ordering::Relaxed)
    }

    fn plan(&self) -> FaultPlan {
        self.plan.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Accounts for a write of `len` bytes and returns how many may go through, and the error
    /// to report after them, if any.
    fn admit_write(&self, len: usize) -> (usize, Option<io::Error>) {
        let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        let admitted = match plan.write_budget_bytes {
            None => return (len, None),
            Some(budget) => budget.min(len as u64),
        };
        plan.write_budget_bytes = Some(plan.write_budget_bytes.unwrap_or(0) - admitted);
        if admitted == len as u64 {
            (len, None)
        } else {
            (
                admitted as usize,
                Some(io::Error::from_raw_os_error(plan.write_errno)),
            )
        }
    }
}

/// A [`Storage`] that delegates to another one and injects the faults armed in [`Faults`].
#[derive(Debug, Clone)]
pub struct FaultyStorage {
    inner: Arc<dyn Storage>,
    faults: Arc<Faults>,
}

impl FaultyStorage {
    pub fn new(inner: Arc<dyn Storage>) -> Self {
        FaultyStorage {
            inner,
            faults: Arc::new(Faults::default()),
        }
    }

    pub fn faults(&self) -> Arc<Faults> {
        self.faults.clone()
    }
}

#[derive(Debug)]
struct FaultyFile {
    inner: Box<dyn SegmentFile>,
    faults: Arc<Faults>,
}

impl Storage for FaultyStorage {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        self.inner.list_dir(path)
    }

    fn open_file(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn SegmentFile>> {
        Ok(Box::new(FaultyFile {
            inner: self.inner.open_file(path, mode)?,
            faults: self.faults.clone(),
        }))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        if let Some(errno) = self.faults.plan().rename_errno {
            return Err(io::Error::from_raw_os_error(errno));
        }
        self.inner.rename(from, to)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.faults.syncs.fetch_add(1, Ordering::Relaxed);
        if let Some(errno) = self.faults.plan().sync_errno {
            return Err(io::Error::from_raw_os_error(errno));
        }
        self.inner.sync_dir(path)
    }
}

impl SegmentFile for FaultyFile {
    fn size_bytes(&self) -> io::Result<u64> {
        self.inner.size_bytes()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let (admitted, error) = self.faults.admit_write(buf.len());
        if admitted > 0 {
            self.inner.write_all_at(&buf[..admitted], offset)?;
            self.faults
                .bytes_written
                .fetch_add(admitted as u64, Ordering::Relaxed);
        }
        match error {
            None => Ok(()),
            Some(error) => Err(error),
        }
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.faults.syncs.fetch_add(1, Ordering::Relaxed);
        if let Some(errno) = self.faults.plan().sync_errno {
            // A failed fsync may have dropped dirty pages; the file keeps whatever the page
            // cache holds, which is exactly why the journal must not trust it afterwards.
            return Err(io::Error::from_raw_os_error(errno));
        }
        self.inner.sync_data()
    }

    fn set_len(&mut self, len_bytes: u64) -> io::Result<()> {
        self.inner.set_len(len_bytes)
    }

    fn sync_handle(&self) -> io::Result<Option<Box<dyn SyncHandle>>> {
        self.faults.sync_handles.fetch_add(1, Ordering::Relaxed);
        Ok(self.inner.sync_handle()?.map(|inner| {
            Box::new(FaultySyncHandle {
                inner,
                faults: self.faults.clone(),
            }) as Box<dyn SyncHandle>
        }))
    }
}

/// A [`SyncHandle`] that fails the way [`FaultyFile::sync_data`] does.
#[derive(Debug)]
struct FaultySyncHandle {
    inner: Box<dyn SyncHandle>,
    faults: Arc<Faults>,
}

impl SyncHandle for FaultySyncHandle {
    fn sync_data(&self) -> io::Result<()> {
        self.faults.syncs.fetch_add(1, Ordering::Relaxed);
        if let Some(errno) = self.faults.plan().sync_errno {
            return Err(io::Error::from_raw_os_error(errno));
        }
        self.inner.sync_data()
    }
}
