// Conversations for supervised fine-tuning: chat templates, the loss mask, and windows padded or
// packed (ChatDataset in lockstep/dataset.hpp).
//
// Note [Chat templates]
// ~~~~~~~~~~~~~~~~~~~~~
// A template is data, not a code path per model: a row of the table below says what goes
// before the first message, before each message (with {role} for its role), after its content
// (the end-of-turn token, which counts toward the loss with the content) and after that (which
// does not). The conversation is rendered to one string and encoded whole, special tokens'
// text ("<|im_start|>") as those tokens, as apply_chat_template renders and tokenises it
// (tests/interop/test_chat_template.cpp checks the ids against transformers for both
// templates): encoding the pieces one by one would not do, as a pre-token may run across them
// (llama3's "\n\n" after the header is two pre-tokens before a letter, one at a string's end).
// A token counts when its first byte lies in a counted piece.
//   chatml (Qwen2, SmolLM2): <|im_start|>{role}\n{content}<|im_end|>\n
//   llama3 (Llama 3):        <|begin_of_text|> once, then
//                            <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>
// Qwen2's and SmolLM2's own templates add a default system message when a conversation has
// none; ours does not (a conversation that wants one says so).
//
// Note [Packed windows]
// ~~~~~~~~~~~~~~~~~~~~~
// A conversation of L ids gives L - 1 next-token positions: inputs ids[0, L-1), targets ids[1,
// L), a target kIgnoreLabel where its token does not count. Unpacked, each conversation has a
// window of its own, filled out with padding (input 0, target kIgnoreLabel): with causal
// attention, padding after the conversation changes none of its positions. Packed, conversations
// go into windows in file order, a conversation starting a new window when the current one has
// no room for it whole (none is split). Each position carries its place in its own
// conversation, 0 where one starts (the padding after the last counts on from 0 too, a sequence
// of its own): the positions the model embeds (RoPE's angles, GPT-2's learned rows), and the
// bound of attention, which for a query at position p reads only the p keys before it (Note
// [Packed attention] in src/model/attention.hpp). A packed window then computes what the same
// conversations each in a window of its own would.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "io/json.hpp"
#include "io/open_input.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"

namespace lockstep {

namespace {

struct ChatTemplate {
  std::string_view name;
  std::string_view start;         // before the first message, not counted
  std::string_view before;        // before each message's content, {role} replaced; not counted
  std::string_view end_of_turn;   // after the content, counted with it
  std::string_view after;         // after the end of turn, not counted
  bool trim = false;              // strip the content's leading and trailing whitespace
  std::array<std::string_view, 4> specials;  // the special tokens the pieces use
};

constexpr ChatTemplate kTemplates[] = {
    {.name = "chatml",
     .start = "",
     .before = "<|im_start|>{role}\n",
     .end_of_turn = "<|im_end|>",
     .after = "\n",
     .trim = false,
     .specials = {"<|im_start|>", "<|im_end|>"}},
    {.name = "llama3",
     .start = "<|begin_of_text|>",
     .before = "<|start_header_id|>{role}<|end_header_id|>\n\n",
     .end_of_turn = "<|eot_id|>",
     .after = "",
     .trim = true,
     .specials = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}},
};
constexpr std::string_view kTemplateNames[] = {"chatml", "llama3"};
constexpr std::string_view kRoles[] = {"system", "user", "assistant"};

const ChatTemplate& find_template(std::string_view name) {
  for (const ChatTemplate& t : kTemplates)
    if (t.name == name) return t;
  throw InputError(fmt::format("data.template: unknown chat template '{}': expected one of {}",
                               name, fmt::join(kTemplateNames, ", ")));
}

std::string_view trimmed(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const std::size_t first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

// Appends `piece` to the rendering, and whether each of its bytes counts.
void append(std::string& text, std::vector<char>& counted, std::string_view piece, bool counts) {
  text.append(piece);
  counted.insert(counted.end(), piece.size(), counts ? 1 : 0);
}

}  // namespace

std::span<const std::string_view> chat_template_names() noexcept { return kTemplateNames; }
std::span<const std::string_view> chat_roles() noexcept { return kRoles; }

ChatTokens render_chat(const Tokenizer& tokenizer, std::string_view chat_template,
                       std::span<const ChatMessage> messages,
                       std::span<const std::string> train_on) {
  const ChatTemplate& t = find_template(chat_template);
  for (const std::string_view special : t.specials)
    if (!special.empty() && !tokenizer.special_token(special))
      throw InputError(fmt::format(
          "data.template {}: the tokenizer {} has no special token {}: expected a tokenizer of "
          "a model trained with this template",
          t.name, tokenizer.source().string(), special));
  std::string text;
  std::vector<char> byte_counts;
  append(text, byte_counts, t.start, false);
  for (const ChatMessage& m : messages) {
    if (std::find(std::begin(kRoles), std::end(kRoles), m.role) == std::end(kRoles))
      throw InputError(fmt::format("unknown role '{}': expected one of {}", m.role,
                                   fmt::join(kRoles, ", ")));
    const bool counts = std::find(train_on.begin(), train_on.end(), m.role) != train_on.end();
    std::string before(t.before);
    before.replace(before.find("{role}"), 6, m.role);
    append(text, byte_counts, before, false);
    append(text, byte_counts, t.trim ? trimmed(m.content) : std::string_view(m.content), counts);
    append(text, byte_counts, t.end_of_turn, counts);
    append(text, byte_counts, t.after, false);
  }
  ChatTokens out;
  out.ids = tokenizer.encode_with_special(text);
  std::size_t at = 0;  // the byte each token starts at
  for (const TokenId id : out.ids) {
    out.counted.push_back(at < byte_counts.size() ? byte_counts[at] : 0);
    at += tokenizer.token_bytes(id).size();
  }
  if (at != text.size())
    throw std::logic_error(fmt::format("render_chat: the ids spell {} bytes of {}", at,
                                       text.size()));
  return out;
}

// ---- ChatDataset ----------------------------------------------------------------------------

ChatDataset::ChatDataset(std::span<const ChatTokens> conversations, int context, int vocab_size,
                         bool pack)
    : conversations_(conversations.size()), context_(context), vocab_size_(vocab_size),
      pack_(pack) {
  if (context < 1) throw InputError(fmt::format("chat dataset: context {}: expected >= 1", context));
  const auto t = static_cast<std::size_t>(context);
  std::size_t used = t;  // positions filled in the current window: none open yet
  const auto open_window = [&] {
    inputs_.resize(inputs_.size() + t, 0);
    labels_.resize(labels_.size() + t, kIgnoreLabel);
    if (pack_) positions_.resize(positions_.size() + t, 0);
    ++windows_;
    used = 0;
  };
  // Numbers the open window's padding as a sequence of its own.
  const auto close_window = [&] {
    if (!pack_ || windows_ == 0) return;
    for (std::size_t k = used; k < t; ++k)
      positions_[(windows_ - 1) * t + k] = static_cast<std::int32_t>(k - used);
  };
  for (const ChatTokens& c : conversations) {
    if (c.ids.size() < 2) continue;  // no position
    const std::size_t positions = c.ids.size() - 1;
    if (positions > t)
      throw std::invalid_argument(fmt::format(
          "chat dataset: a conversation of {} tokens: expected at most context + 1 = {}",
          c.ids.size(), t + 1));
    if (!pack_ || used + positions > t) {
      close_window();
      open_window();
    }
    const std::size_t at = (windows_ - 1) * t + used;
    for (std::size_t k = 0; k < positions; ++k) {
      if (c.ids[k + 1] >= static_cast<std::uint32_t>(vocab_size) ||
          c.ids[k] >= static_cast<std::uint32_t>(vocab_size))
        throw InputError(fmt::format("chat dataset: token {}: expected an id < vocab_size = {}",
                                     std::max(c.ids[k], c.ids[k + 1]), vocab_size));
      inputs_[at + k] = c.ids[k];
      if (c.counted[k + 1]) {
        labels_[at + k] = static_cast<std::int32_t>(c.ids[k + 1]);
        ++counted_;
      }
      if (pack_) positions_[at + k] = static_cast<std::int32_t>(k);
    }
    used += positions;
  }
  close_window();
}

void ChatDataset::get(std::size_t i, float* x, std::int32_t* y) const {
  if (i >= windows_)
    throw std::out_of_range(fmt::format("chat dataset: sample {} of {}", i, windows_));
  const auto t = static_cast<std::size_t>(context_);
  for (std::size_t k = 0; k < t; ++k) x[k] = static_cast<float>(inputs_[i * t + k]);
  std::memcpy(y, labels_.data() + i * t, t * sizeof(std::int32_t));
}

void ChatDataset::get_positions(std::size_t i, std::int32_t* positions) const {
  if (i >= windows_)
    throw std::out_of_range(fmt::format("chat dataset: sample {} of {}", i, windows_));
  const auto t = static_cast<std::size_t>(context_);
  for (std::size_t k = 0; k < t; ++k)
    positions[k] = pack_ ? positions_[i * t + k] : static_cast<std::int32_t>(k);
}

// ---- The reader -----------------------------------------------------------------------------

namespace {

using detail::JsonValue;

// A JSON line's messages, or the reason it has none (a bad record).
struct Record {
  std::vector<ChatMessage> messages;
  std::string error;
};

const JsonValue* member(const JsonValue& object, std::string_view key) {
  for (const auto& [k, v] : object.members)
    if (k == key) return &v;
  return nullptr;
}

Record parse_record(std::string_view line) {
  Record r;
  JsonValue v;
  try {
    v = detail::parse_json(line);
  } catch (const detail::JsonError& e) {
    r.error = fmt::format("column {}: invalid JSON: {}", e.offset() + 1, e.what());
    return r;
  }
  constexpr std::string_view kExpected =
      "expected a JSON object with \"messages\" (a list of {\"role\", \"content\"}) or "
      "\"prompt\" and \"response\" strings";
  if (v.kind != JsonValue::Kind::object) {
    r.error = fmt::format("{}, got {}", kExpected, v.kind_name());
    return r;
  }
  const auto string_field = [&](const JsonValue& object, std::string_view key,
                                std::string_view where) -> std::optional<std::string> {
    const JsonValue* f = member(object, key);
    if (!f) {
      r.error = fmt::format("{}no \"{}\": {}", where, key, kExpected);
      return std::nullopt;
    }
    if (f->kind != JsonValue::Kind::string) {
      r.error = fmt::format("column {}: {}\"{}\": expected a string, got {}", f->offset + 1,
                            where, key, f->kind_name());
      return std::nullopt;
    }
    return f->text;
  };
  const JsonValue* messages = member(v, "messages");
  if (!messages) {
    if (!member(v, "prompt") && !member(v, "response")) {
      r.error = fmt::format("no \"messages\": {}", kExpected);
      return r;
    }
    auto prompt = string_field(v, "prompt", "");
    if (!prompt) return r;
    auto response = string_field(v, "response", "");
    if (!response) return r;
    r.messages = {{"user", std::move(*prompt)}, {"assistant", std::move(*response)}};
    return r;
  }
  if (messages->kind != JsonValue::Kind::array || messages->items.empty()) {
    r.error = fmt::format("column {}: \"messages\": expected a non-empty list of {{\"role\", "
                          "\"content\"}} objects, got {}",
                          messages->offset + 1,
                          messages->kind == JsonValue::Kind::array ? "an empty list"
                                                                   : messages->kind_name());
    return r;
  }
  for (std::size_t i = 0; i < messages->items.size(); ++i) {
    const JsonValue& m = messages->items[i];
    const std::string where = fmt::format("messages[{}]: ", i);
    if (m.kind != JsonValue::Kind::object) {
      r.error = fmt::format("column {}: {}expected a {{\"role\", \"content\"}} object, got {}",
                            m.offset + 1, where, m.kind_name());
      return r;
    }
    auto role = string_field(m, "role", where);
    if (!role) return r;
    if (std::find(std::begin(kRoles), std::end(kRoles), *role) == std::end(kRoles)) {
      r.error = fmt::format("column {}: {}unknown role '{}': expected one of {}", m.offset + 1,
                            where, *role, fmt::join(kRoles, ", "));
      return r;
    }
    auto content = string_field(m, "content", where);
    if (!content) return r;
    r.messages.push_back({std::move(*role), std::move(*content)});
  }
  return r;
}

}  // namespace

ChatSplit load_chat(const std::filesystem::path& file, const Tokenizer& tokenizer,
                    int vocab_size, const ChatOptions& options, double eval_fraction) {
  const std::string name = file.string();
  if (tokenizer.vocab_size() > static_cast<std::size_t>(vocab_size))
    throw InputError(fmt::format("{}: vocab_size {}: the tokenizer {} has {} ids", name,
                                 vocab_size, tokenizer.source().string(), tokenizer.vocab_size()));
  (void)find_template(options.chat_template);
  for (const std::string& role : options.train_on)
    if (std::find(std::begin(kRoles), std::end(kRoles), role) == std::end(kRoles))
      throw InputError(fmt::format("data.train_on: unknown role '{}': expected some of {}", role,
                                   fmt::join(kRoles, ", ")));
  const std::string bytes = detail::read_input(file, detail::InputKind::data);
  const std::size_t limit = static_cast<std::size_t>(options.context) + 1;
  std::vector<ChatTokens> conversations;
  std::size_t skipped = 0;
  std::size_t line = 0;
  for (std::size_t begin = 0; begin < bytes.size();) {
    std::size_t end = bytes.find('\n', begin);
    if (end == std::string::npos) end = bytes.size();
    std::string_view text(bytes.data() + begin, end - begin);
    begin = end + 1;
    ++line;
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    if (trimmed(text).empty()) continue;  // blank lines separate nothing
    Record r = parse_record(text);
    ChatTokens tokens;
    if (r.error.empty()) {
      tokens = render_chat(tokenizer, options.chat_template, r.messages, options.train_on);
      if (tokens.ids.size() > limit)
        r.error = fmt::format(
            "a conversation of {} tokens does not fit the window: expected at most model.context "
            "+ 1 = {} (a longer model.context, or data.skip_bad_records: true to leave it out)",
            tokens.ids.size(), limit);
    }
    if (!r.error.empty()) {
      if (!options.skip_bad_records)
        throw InputError(fmt::format("{}:{}: {}", name, line, r.error));
      ++skipped;
      continue;
    }
    conversations.push_back(std::move(tokens));
  }
  if (conversations.empty())
    throw InputError(fmt::format("{}: no conversations{}: expected JSON Lines of {{\"messages\": "
                                 "[...]}} or {{\"prompt\", \"response\"}}",
                                 name, skipped ? fmt::format(" ({} bad records skipped)", skipped)
                                               : std::string()));
  if (!(eval_fraction >= 0.0 && eval_fraction < 1.0))
    throw InputError(
        fmt::format("eval_fraction: expected a value in [0, 1), got {}", eval_fraction));
  const std::size_t n = conversations.size();
  const auto n_eval = static_cast<std::size_t>(std::llround(eval_fraction * static_cast<double>(n)));
  if (n_eval >= n)
    throw InputError(fmt::format(
        "{}: {} conversations with eval_fraction {} leave none for training", name, n,
        eval_fraction));
  const std::span<const ChatTokens> all(conversations);
  auto train = std::make_shared<ChatDataset>(all.first(n - n_eval), options.context, vocab_size,
                                             options.pack);
  train->set_skipped(skipped);
  auto eval = std::make_shared<ChatDataset>(all.subspan(n - n_eval), options.context, vocab_size,
                                            options.pack);
  return {std::move(train), std::move(eval)};
}

}  // namespace lockstep
