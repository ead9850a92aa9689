// tokenize_files: text files, JSON lines or standard input into llm.c token files.
//
// Note [Tokenizing files]
// Documents. A text file (or standard input) is one document, a .jsonl file one per line (its
// "text" field). Each document's tokens are preceded by the tokenizer's document_start(): GPT-2's
// <|endoftext|>, as llm.c's preparation scripts write them, and so any model's end-of-text
// token, unless its tokenizer puts a beginning-of-text token before each sequence (Llama 3's
// <|begin_of_text|>), which then comes first instead.
//
// Parts. A document longer than kPartBytes (16 KiB) is cut into parts of about that size, each
// cut where the pre-tokens are known to break (safe_cut, by the tokenizer's CutRule), so the ids
// are those of the whole document. GPT-2's pattern: after a '\n' between two visible ASCII
// characters ("x\nA": the '\n' is a piece of its own however the text goes on), or before a ' '
// between a visible ASCII character and an ASCII letter ("x ab": " ab" starts a piece). Llama
// 3's and Qwen2's patterns (and GPT-2's, and Digits, when a tokenizer.json names them): only
// after the '\n' of "a\nb" between ASCII letters, since their punctuation takes the newlines
// after it (".\n" is one piece) and a space before a letter may join it ("\tab"); NFC composes
// nothing across it. Any other pattern, a prefix space per piece of text, or an added token that
// may span or strip a newline: no cut, the document is encoded whole (its memory is then the
// document's, not kPartBytes'). A part is what the split between the outputs and the memory
// bound count in.
//
// The eval split. With eval_out, each part (a short document is one part) goes to the eval
// file when that brings the eval file's share of the tokens so far closer to eval_fraction,
// else to the training file: deterministic, spread over the whole input, and independent of
// the number of threads. An eval part of a long document that begins after its first part has
// no <|endoftext|> before it; the document did not start there. Whole parts fit many documents;
// a few long ones are a few parts of ~4,000 tokens each, too coarse for a small share (one
// 130 KB book at 0.05 held out nothing, or 0.7%). So once the input is read, an eval file more
// than a tenth short of eval_fraction of all the tokens is made up from the stream's tail: the
// training file's last tokens move to the end of the eval file (read back from its temp file a
// chunk at a time, so memory stays bounded). One book then holds out its last pages.
//
// Memory. The reader collects parts into a batch of about kBatchBytes (4 MiB) of text, oneTBB
// tokenizes the batch's parts in parallel, and the writer appends their ids to the outputs'
// temp files.
// Overlap. A thread of its own reads the next batch (kBatchesAhead, 1) and another appends the
// last one's ids to the outputs while the caller's thread encodes one with oneTBB, so the cores
// are not idle while files are read or written; batches are written in order, on one thread.
// Held at once: two batches of text and three batches' ids (at most 4 bytes of ids per byte of
// text; about 1 for English), each thread's pre-token cache (at most 65,536 pieces, a few MB)
// and output buffer, and whatever one part holds beyond kPartBytes: the longest stretch of a
// document with no safe cut, or the longest JSON line. So about 40 MiB plus those stretches.
//
// Forced cuts. A stretch with no safe cut is at most kMaxStretchBytes (1 MiB): past that the
// document is cut at 1 MiB (at the first byte of the character there) and the two sides are
// encoded as two texts. Such a stretch is a run of megabytes with no "a\nb" (a long line of
// letters, a base64 blob), or any document over 1 MiB under a tokenizer with no cut rule; only
// there may the ids differ from the whole document's, around the cut. With Note [Long
// pre-tokens] (a pre-token is merged in pieces of 64 KiB, and 1 MiB is a multiple of that), a
// line that is one run of ASCII letters gets exactly the ids of the whole line. A JSON line is
// parsed whole, so its memory is that of its line. So memory stays bounded whatever the input:
// measured (GPT-2, 2 threads, bench/measure_tokenizer.sh), see bench/RESULTS.md.
#include "text/tokenize_files.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <fmt/format.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "common/tsan_fork_join.hpp"
#include "io/durable_file.hpp"
#include "io/file_roles.hpp"
#include "io/json.hpp"
#include "io/open_input.hpp"
#include "io/output_path.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"
#include "text/tokenizer_impl.hpp"

namespace lockstep {
namespace detail {

namespace {

bool visible_ascii(char c) { return c > ' ' && c < 0x7F; }
bool ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

std::size_t safe_cut(std::string_view text, std::size_t from, CutRule rule) noexcept {
  if (rule == CutRule::none) return std::string_view::npos;
  if (rule == CutRule::newline_between_letters) {
    for (std::size_t p = std::max<std::size_t>(from, 2); p < text.size(); ++p)
      if (text[p - 1] == '\n' && ascii_letter(text[p - 2]) && ascii_letter(text[p])) return p;
    return std::string_view::npos;
  }
  for (std::size_t p = std::max<std::size_t>(from, 2); p < text.size(); ++p) {
    if (text[p - 1] == '\n' && visible_ascii(text[p - 2]) && visible_ascii(text[p])) return p;
    if (text[p] == ' ' && p + 1 < text.size() && visible_ascii(text[p - 1]) &&
        ascii_letter(text[p + 1]))
      return p;
  }
  return std::string_view::npos;
}

std::size_t part_cut(std::string_view text, std::size_t from, CutRule rule) noexcept {
  const std::size_t cut = safe_cut(text.substr(0, kMaxStretchBytes + 2), from, rule);
  if (cut <= kMaxStretchBytes) return cut;
  if (text.size() <= kMaxStretchBytes + 1) return std::string_view::npos;
  std::size_t at = kMaxStretchBytes;
  for (int back = 0; back < 3 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80; ++back)
    --at;
  return (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80 ? kMaxStretchBytes : at;
}

}  // namespace detail

namespace {

namespace fs = std::filesystem;
using detail::kBatchBytes;
using detail::kBatchesAhead;
using detail::kPartBytes;

// llm.c's .bin header (as src/data/tokens.cpp reads it): 256 int32, then the tokens.
constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::size_t kLlmcHeaderInts = 256;

// A piece of work: a part of a document, or a JSON line whose "text" is the document.
struct Unit {
  std::string text;
  bool json_line = false;
  bool starts_document = false;
  std::size_t input = 0;    // index into the inputs, for messages
  std::uint64_t line = 0;   // of a JSON line
};

// What a unit became: the ids of each of its parts (a long JSON document has several), or the
// message of its error.
struct UnitIds {
  std::vector<std::vector<TokenId>> parts;
  std::string error;
};

// Reads one input's bytes: a file, or standard input.
class ByteSource {
 public:
  // stop: the caller's (a signal's); cancel: the prefetcher's, when nobody waits any more.
  ByteSource(const fs::path& path, const std::atomic<bool>* stop, const std::atomic<bool>* cancel)
      : path_(path), stop_(stop), cancel_(cancel) {
    if (path == "-") {
      fd_ = STDIN_FILENO;
    } else {
      detail::InputFd in = detail::open_input(path, detail::InputKind::data);
      fd_ = in.release();
      owned_ = true;
    }
  }
  ~ByteSource() {
    if (owned_) ::close(fd_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // Appends up to `size` bytes to `out`; false at the end of the input.
  bool read(std::string& out, std::size_t size) {
    const std::size_t before = out.size();
    out.resize(before + size);
    while (true) {
      if ((stop_ && stop_->load()) || (cancel_ && cancel_->load())) throw Interrupted();
      // Waits in slices of 100 ms while standard input or a FIFO has nothing to give, so that
      // a stop is seen here even when the signal was handled on another thread.
      ::pollfd ready{fd_, POLLIN, 0};
      const int polled = ::poll(&ready, 1, 100);
      if (polled == 0 || (polled < 0 && errno == EINTR)) continue;
      const ::ssize_t n = ::read(fd_, out.data() + before, size);
      if (n < 0 && errno == EINTR) continue;  // a signal: look at stop again
      if (n < 0)
        throw InputError(fmt::format("{}: cannot read: {}", name(),
                                     std::generic_category().message(errno)));
      out.resize(before + static_cast<std::size_t>(n));
      bytes_ += static_cast<std::uint64_t>(n);
      return n > 0;
    }
  }
  std::string name() const { return path_ == "-" ? "standard input" : path_.string(); }
  std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  fs::path path_;
  const std::atomic<bool>* stop_;
  const std::atomic<bool>* cancel_;
  int fd_ = -1;
  bool owned_ = false;
  std::uint64_t bytes_ = 0;
};

constexpr std::size_t kReadBytes = 1u << 20;

// Cuts `text` into parts of about kPartBytes (detail::part_cut); the last part holds the rest.
std::vector<std::string_view> cut_parts(std::string_view text, detail::CutRule rule) {
  std::vector<std::string_view> parts;
  while (text.size() > kPartBytes) {
    const std::size_t cut = detail::part_cut(text, kPartBytes, rule);
    if (cut == std::string_view::npos) break;
    parts.push_back(text.substr(0, cut));
    text.remove_prefix(cut);
  }
  parts.push_back(text);
  return parts;
}

// The units of one input, a batch at a time.
class InputReader {
 public:
  InputReader(const fs::path& path, std::size_t index, const std::atomic<bool>* stop,
              const std::atomic<bool>* cancel, detail::CutRule rule)
      : source_(path, stop, cancel),
        index_(index),
        jsonl_(path.extension() == ".jsonl"),
        rule_(rule) {}

  // Appends units to `batch` until it holds about kBatchBytes of text (counted in `bytes`);
  // false once this input is exhausted.
  bool fill(std::vector<Unit>& batch, std::size_t& bytes) {
    while (bytes < kBatchBytes) {
      if (!done_reading_ && !source_.read(buffer_, kReadBytes)) done_reading_ = true;
      const std::size_t before = batch.size();
      if (jsonl_) take_lines(batch);
      else take_parts(batch);
      for (std::size_t i = before; i < batch.size(); ++i) bytes += batch[i].text.size();
      if (done_reading_ && buffer_.empty() && finished_) return false;
    }
    return true;
  }

  std::uint64_t bytes_read() const noexcept { return source_.bytes(); }
  std::uint64_t documents() const noexcept { return documents_; }

 private:
  // Cuts the buffer into parts (detail::part_cut); at the end of the input, the rest
  // is the last part.
  void take_parts(std::vector<Unit>& batch) {
    std::size_t start = 0;
    while (buffer_.size() - start > kPartBytes) {
      const std::string_view rest = std::string_view(buffer_).substr(start);
      const std::size_t cut = detail::part_cut(rest, std::max(kPartBytes, scanned_), rule_);
      if (cut == std::string_view::npos) {
        scanned_ = rest.size() - 1;  // no cut before here (a cut there needs the next byte)
        break;
      }
      push(batch, std::string(rest.substr(0, cut)), false);
      start += cut;
      scanned_ = 0;
    }
    buffer_.erase(0, start);
    if (done_reading_ && !finished_) {
      push(batch, std::exchange(buffer_, std::string()), false);
      finished_ = true;
    }
  }

  void take_lines(std::vector<Unit>& batch) {
    std::size_t start = 0;
    while (true) {
      std::size_t end = buffer_.find('\n', start);
      if (end == std::string::npos) {
        if (!done_reading_) break;
        if (start < buffer_.size()) end = buffer_.size();  // a last line without '\n'
        else {
          finished_ = true;
          break;
        }
      }
      ++line_;
      push(batch, buffer_.substr(start, end - start), true);
      start = std::min(end + 1, buffer_.size());
    }
    buffer_.erase(0, start);
  }

  void push(std::vector<Unit>& batch, std::string text, bool json_line) {
    const bool starts = json_line || !document_started_;
    if (starts) ++documents_;
    document_started_ = true;
    batch.push_back({std::move(text), json_line, starts, index_, line_});
  }

  ByteSource source_;
  std::size_t index_;
  bool jsonl_;
  detail::CutRule rule_;
  std::string buffer_;
  bool done_reading_ = false;
  bool finished_ = false;
  bool document_started_ = false;
  std::size_t scanned_ = 0;  // of the buffer, searched for a cut in vain
  std::uint64_t line_ = 0;
  std::uint64_t documents_ = 0;
};

// A JSON line's "text", or the message saying why there is none.
std::optional<std::string> json_text(const Unit& unit, const std::string& file,
                                     std::string& error) {
  const auto fail = [&](std::size_t column, std::string_view what) {
    error = fmt::format("{}:{}: {}{}", file, unit.line,
                        column ? fmt::format("column {}: ", column) : "", what);
    return std::nullopt;
  };
  if (unit.text.empty() || unit.text == "\r")
    return fail(0, "an empty line: expected a JSON object with a \"text\" string");
  detail::JsonValue v;
  try {
    v = detail::parse_json(unit.text);
  } catch (const detail::JsonError& e) {
    return fail(e.offset() + 1, fmt::format("invalid JSON: {}", e.what()));
  }
  if (v.kind != detail::JsonValue::Kind::object)
    return fail(0, fmt::format("expected a JSON object with a \"text\" string, got {}",
                               v.kind_name()));
  for (auto& [key, value] : v.members) {
    if (key != "text") continue;
    if (value.kind != detail::JsonValue::Kind::string)
      return fail(value.offset + 1, fmt::format("\"text\": expected a string, got {}",
                                                value.kind_name()));
    return std::move(value.text);
  }
  return fail(0, "no \"text\" field: expected a JSON object with a \"text\" string");
}

// One unit's ids: its parts, the first with the tokenizer's document_start() when it starts a
// document.
UnitIds encode_unit(const Tokenizer& tokenizer, const Unit& unit, const std::string& file,
                    std::span<const TokenId> document_start, bool allow_special) {
  UnitIds out;
  std::optional<std::string> parsed;
  if (unit.json_line && !(parsed = json_text(unit, file, out.error))) return out;
  const std::string_view text = parsed ? std::string_view(*parsed) : std::string_view(unit.text);
  const std::vector<std::string_view> parts =
      unit.json_line ? cut_parts(text, tokenizer.impl().pipeline.cut) : std::vector{text};
  for (std::size_t i = 0; i < parts.size(); ++i) {
    std::vector<TokenId>& ids = out.parts.emplace_back();
    if (i == 0 && unit.starts_document)
      ids.insert(ids.end(), document_start.begin(), document_start.end());
    if (allow_special) tokenizer.encode_with_special(parts[i], ids);
    else tokenizer.encode(parts[i], ids);
  }
  return out;
}

// An output token file, written through a temp file (AtomicFileWriter) as the ids arrive.
class TokenFileOut {
 public:
  TokenFileOut(const fs::path& path, TokenFormat format, int token_bytes)
      : path_(path), file_(path), format_(format), token_bytes_(token_bytes) {
    if (format_ == TokenFormat::llmc) {
      const std::vector<std::int32_t> header(kLlmcHeaderInts, 0);
      file_.write(std::as_bytes(std::span(header)));
    }
  }

  void append(std::span<const TokenId> ids) {
    if (token_bytes_ == 2) {
      narrow_.assign(ids.begin(), ids.end());
      file_.write(std::as_bytes(std::span(narrow_)));
    } else {
      file_.write(std::as_bytes(ids));
    }
    count_ += ids.size();
  }

  // Writes the header's token count and renames the file into place.
  void commit() {
    if (format_ == TokenFormat::llmc) {
      if (count_ > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()))
        throw InputError(fmt::format(
            "{}: {} tokens: an llm.c token file holds at most {} (its header's count is an "
            "int32); tokenize the input in pieces", path_.string(), count_,
            std::numeric_limits<std::int32_t>::max()));
      const std::int32_t head[3] = {kLlmcMagic, token_bytes_ == 2 ? 1 : 2,
                                    static_cast<std::int32_t>(count_)};
      file_.write_at(0, std::as_bytes(std::span(head)));
    }
    file_.commit();
  }
  std::uint64_t count() const noexcept { return count_; }

  // Moves this file's last `n` tokens to the end of `to`, a file of the same token width.
  void move_tail(std::uint64_t n, TokenFileOut& to) {
    const std::uint64_t first = count_ - n;
    const auto offset = [&](std::uint64_t token) {
      return header_bytes() + token * static_cast<std::uint64_t>(token_bytes_);
    };
    const int fd = ::open(file_.temp_path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) detail::fail_input(file_.temp_path(), std::generic_category().message(errno));
    std::vector<std::byte> chunk(std::size_t{1} << 20);
    try {
      for (std::uint64_t at = offset(first), end = offset(count_); at < end;) {
        const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), end - at));
        const ::ssize_t got = ::pread(fd, chunk.data(), want, static_cast<::off_t>(at));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
          detail::fail_input(file_.temp_path(), got < 0 ? std::generic_category().message(errno)
                                                        : "ends early: read back while writing it");
        const std::size_t whole = static_cast<std::size_t>(got) / token_bytes_ * token_bytes_;
        to.file_.write(std::span(chunk).first(whole));
        to.count_ += whole / token_bytes_;
        at += whole;
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    file_.truncate(offset(first));
    count_ = first;
  }

 private:
  std::uint64_t header_bytes() const noexcept {
    return format_ == TokenFormat::llmc ? kLlmcHeaderInts * sizeof(std::int32_t) : 0;
  }

  fs::path path_;
  detail::AtomicFileWriter file_;
  TokenFormat format_;
  int token_bytes_;
  std::vector<std::uint16_t> narrow_;
  std::uint64_t count_ = 0;
};

// A batch of units, with what had been read when it was.
struct Batch {
  std::vector<Unit> units;
  std::uint64_t bytes_read = 0, documents_read = 0;
};

// Note [Tokenizing files], "Overlap": a thread of its own calls `read` for the next batches, up
// to kBatchesAhead ahead of the one the caller takes, so that reading overlaps encoding. What
// `read` throws reaches the caller after the batches read before it, as if read in line.
// Destroying it (at the end, or while an exception leaves the caller) stops and joins the
// thread: a read waiting on standard input sees the cancel within 100 ms.
class Prefetcher {
 public:
  using Read = std::function<std::optional<Batch>()>;  // the next batch, or nullopt at the end
  // cancel: set when it is destroyed, for `read` to stop at (ByteSource's reads do).
  Prefetcher(std::atomic<bool>& cancel, Read read)
      : cancel_(cancel), read_(std::move(read)), thread_([this] { run(); }) {}
  ~Prefetcher() {
    {
      const std::lock_guard lock(mutex_);  // so that run() cannot miss it between test and wait
      cancel_.store(true);
    }
    changed_.notify_all();
    thread_.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next batch, nullopt after the last, or what the reader threw.
  std::optional<Batch> next() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return !ready_.empty() || done_; });
    if (!ready_.empty()) {
      Batch batch = std::move(ready_.front());
      ready_.pop_front();
      changed_.notify_all();
      return batch;
    }
    if (error_) std::rethrow_exception(error_);
    return std::nullopt;
  }

 private:
  void run() {
    try {
      while (true) {
        {
          std::unique_lock lock(mutex_);
          changed_.wait(lock, [this] { return ready_.size() < kBatchesAhead || cancel_.load(); });
          if (cancel_.load()) return;
        }
        std::optional<Batch> batch = read_();
        const std::lock_guard lock(mutex_);
        if (!batch) done_ = true;
        else ready_.push_back(std::move(*batch));
        changed_.notify_all();
        if (done_) return;
      }
    } catch (...) {
      const std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      done_ = true;
      changed_.notify_all();
    }
  }

  std::atomic<bool>& cancel_;
  Read read_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;
  bool done_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: it starts once the rest is made
};

// Note [Tokenizing files], "Overlap": a thread of its own calls `write` on each batch of ids, in
// the order pushed, while the caller encodes the next; at most one batch waits. What `write`
// throws (a bad unit's InputError) reaches the caller at its next push() or at finish(), and
// no batch after it is written. Destroying it without finish() (an exception leaving the
// caller) drops what waits and joins the thread.
class Writer {
 public:
  using Write = std::function<void(std::vector<UnitIds>&)>;
  explicit Writer(Write write) : write_(std::move(write)), thread_([this] { run(); }) {}
  ~Writer() {
    {
      const std::lock_guard lock(mutex_);
      closed_ = cancelled_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void push(std::vector<UnitIds> ids) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return !pending_ || error_; });
    if (error_) std::rethrow_exception(error_);
    pending_ = std::move(ids);
    changed_.notify_all();
  }
  // Waits until every batch pushed is written; rethrows what writing one threw.
  void finish() {
    std::unique_lock lock(mutex_);
    closed_ = true;
    changed_.notify_all();
    changed_.wait(lock, [this] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run() {
    while (true) {
      std::vector<UnitIds> ids;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [this] { return pending_ || closed_; });
        if (!pending_ || cancelled_) {
          done_ = true;
          changed_.notify_all();
          return;
        }
        ids = std::move(*pending_);
        pending_.reset();
        changed_.notify_all();
      }
      try {
        write_(ids);
      } catch (...) {
        const std::lock_guard lock(mutex_);
        error_ = std::current_exception();
        done_ = true;
        changed_.notify_all();
        return;
      }
    }
  }

  Write write_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<std::vector<UnitIds>> pending_;
  bool closed_ = false, cancelled_ = false, done_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: it starts once the rest is made
};

void check_options(const Tokenizer& tokenizer, const TokenizeOptions& o, int token_bytes) {
  if (o.inputs.empty()) throw InputError("tokenize: expected at least one INPUT");
  if (o.out.empty()) throw InputError("tokenize: expected --out FILE");
  if (tokenizer.document_start().empty())
    throw InputError(fmt::format("{}: the tokenizer has no token to start each document with: "
                                 "neither a post-processor's BOS nor an end-of-text token (give "
                                 "a tokenizer_config.json with eos_token beside it)",
                                 tokenizer.source().string()));
  if (o.format != TokenFormat::llmc && o.format != TokenFormat::raw)
    throw InputError("tokenize --format: expected llmc or raw");
  if (o.format == TokenFormat::raw && token_bytes != 2)
    throw InputError(fmt::format("tokenize --format raw: holds uint16 tokens, but {} has {} ids: "
                                 "use --format llmc", tokenizer.source().string(),
                                 tokenizer.vocab_size()));
  if (!o.eval_out.empty() && !(o.eval_fraction > 0.0 && o.eval_fraction < 1.0))
    throw InputError(fmt::format("tokenize --eval-fraction {}: expected a number in (0, 1) with "
                                 "--eval-out", o.eval_fraction));
  if (o.eval_out.empty() && o.eval_fraction != 0.0)
    throw InputError("tokenize --eval-fraction: give --eval-out FILE for the eval split");
  if (std::count(o.inputs.begin(), o.inputs.end(), fs::path("-")) > 1)
    throw InputError("tokenize: standard input ('-') can be read once");
  detail::FileRoles files;  // Note [An output is never an input]
  for (const fs::path& input : o.inputs)
    if (input != "-") files.input(input, "tokenize INPUT");
  files.input_dir(tokenizer.source(), "tokenize --tokenizer", detail::kTokenizerFiles)
      .output(o.out, "tokenize --out")
      .output(o.eval_out, "tokenize --eval-out")
      .check();
  detail::check_output_file(o.out, "tokenize --out");
  if (!o.eval_out.empty()) detail::check_output_file(o.eval_out, "tokenize --eval-out");
  // Every input opens before any is read: a typo in the last name fails now, not in an hour.
  for (const fs::path& input : o.inputs)
    if (input != "-") detail::open_input(input, detail::InputKind::data);
}

}  // namespace

TokenizeCounts tokenize_files(const Tokenizer& tokenizer, const TokenizeOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  const int token_bytes = tokenizer.vocab_size() <= 65536 ? 2 : 4;
  check_options(tokenizer, o, token_bytes);

  TokenFileOut train(o.out, o.format, token_bytes);
  std::optional<TokenFileOut> eval;
  if (!o.eval_out.empty()) eval.emplace(o.eval_out, o.format, token_bytes);
  std::vector<std::string> names;
  for (const fs::path& input : o.inputs)
    names.push_back(input == "-" ? "standard input" : input.string());

  TokenizeCounts counts;
  counts.token_bytes = token_bytes;
  const std::vector<TokenId> document_start = tokenizer.document_start();
  // The reader's, read on its thread and here once it has joined.
  std::uint64_t finished_bytes = 0, finished_documents = 0;
  {
    std::size_t next_input = 0;
    std::optional<InputReader> reader;
    std::atomic<bool> cancel{false};
    Prefetcher prefetcher(cancel, [&]() -> std::optional<Batch> {
      Batch batch;
      std::size_t bytes = 0;
      while (bytes < kBatchBytes && (reader || next_input < o.inputs.size())) {
        if (!reader) {
          reader.emplace(o.inputs[next_input], next_input, o.stop, &cancel,
                         tokenizer.impl().pipeline.cut);
          ++next_input;
        }
        if (!reader->fill(batch.units, bytes)) {
          finished_bytes += reader->bytes_read();
          finished_documents += reader->documents();
          reader.reset();
        }
      }
      if (batch.units.empty()) return std::nullopt;
      batch.bytes_read = finished_bytes + (reader ? reader->bytes_read() : 0);
      batch.documents_read = finished_documents + (reader ? reader->documents() : 0);
      return batch;
    });
    // The writer's thread appends each batch's ids to the outputs (and, with eval_out, picks
    // the file of each part) while this one encodes the next.
    Writer writer([&](std::vector<UnitIds>& ids) {
      for (UnitIds& unit : ids) {
        if (!unit.error.empty()) throw InputError(unit.error);
        for (const std::vector<TokenId>& part : unit.parts) {
          // The eval file when that brings its share closer to the fraction: e + u/2 < f (T + u).
          const auto total =
              static_cast<double>(train.count() + (eval ? eval->count() : 0) + part.size());
          const bool to_eval =
              eval && static_cast<double>(eval->count()) + 0.5 * static_cast<double>(part.size()) <
                          o.eval_fraction * total;
          (to_eval ? *eval : train).append(part);
        }
      }
    });
    std::uint64_t tokens = 0;  // encoded so far, for the progress
    while (std::optional<Batch> batch = prefetcher.next()) {
      if (o.stop && o.stop->load()) throw Interrupted();
      std::vector<UnitIds> ids(batch->units.size());
      detail::TsanForkJoin fork_join;
      static char site;  // Note [TSan and oneTBB]: a loop that may follow another
      const auto task = [&](std::size_t i) {
        detail::tsan_acquire(&site);
        fork_join.task_begins();
        const Unit& unit = batch->units[i];
        ids[i] = encode_unit(tokenizer, unit, names[unit.input], document_start, o.allow_special);
        fork_join.task_ends();
      };
      detail::tsan_release(&site);
      tbb::parallel_for(std::size_t{0}, batch->units.size(), task);
      fork_join.joined();
      for (const UnitIds& unit : ids)
        for (const std::vector<TokenId>& part : unit.parts) tokens += part.size();
      writer.push(std::move(ids));
      if (o.on_progress) {
        TokenizeProgress p;
        p.bytes = batch->bytes_read;
        p.documents = batch->documents_read;
        p.tokens = tokens;
        p.elapsed_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        o.on_progress(p);
      }
    }
    writer.finish();
  }  // the reader's and the writer's threads have joined
  if (eval) {
    // Note [Tokenizing files]: the stream's tail makes up a share that whole parts missed.
    const std::uint64_t total = train.count() + eval->count();
    const auto wanted = static_cast<std::uint64_t>(
        std::llround(o.eval_fraction * static_cast<double>(total)));
    if (static_cast<double>(eval->count()) < 0.9 * static_cast<double>(wanted))
      train.move_tail(std::min(wanted - eval->count(), train.count()), *eval);
    if (eval->count() == 0)
      throw InputError(fmt::format(
          "tokenize --eval-fraction {}: the eval split is empty ({} tokens in all, of which that "
          "share is less than one): raise the fraction or give more text",
          o.eval_fraction, total));
  }
  if (o.stop && o.stop->load()) throw Interrupted();
  if (eval) eval->commit();
  train.commit();

  counts.documents = finished_documents;
  counts.bytes = finished_bytes;
  counts.train_tokens = train.count();
  counts.eval_tokens = eval ? eval->count() : 0;
  counts.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return counts;
}

}  // namespace lockstep
