// The built-in chat templates against transformers' apply_chat_template, id for id
// (tests/interop/chat_template.py, with SmolLM2's and Llama 3's published templates), on the
// shipped chat tokenizer (third_party/chat/tokenizer: both templates' special tokens) for
// conversations of every role, several turns, leading and trailing spaces (llama3 trims them),
// newlines and punctuation. Skips, saying why, when the environment cannot be made.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../cli/cli_runner.hpp"
#include "../data/temp_files.hpp"
#include "io/json.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/tokenizer.hpp"
#include "python_env.hpp"
#include "same_ids.hpp"

using lockstep::ChatMessage;
using lockstep::TokenId;

namespace {

const std::vector<std::vector<ChatMessage>> kConversations = {
    {{"system", "You answer in one short sentence."},
     {"user", "What colour is a ripe tomato?"},
     {"assistant", "A ripe tomato is red."}},
    {{"system", "Be kind."},
     {"user", "Hello, who are you?"},
     {"assistant", "I am a small model.\nI know the play."},
     {"user", "  Who is Jaques?  "},
     {"assistant", " Jaques is a melancholy lord; he says \"all the world's a stage\". "}},
    {{"system", "x"}, {"user", "3 + 4 = ?"}, {"assistant", "7"}},
};

std::string messages_json() {
  std::string out = "[";
  for (const auto& conv : kConversations) {
    out += out.size() > 1 ? ", [" : "[";
    for (std::size_t i = 0; i < conv.size(); ++i)
      out += (i ? ", " : "") + std::string("{\"role\": ") +
             lockstep::detail::json_quote(conv[i].role) +
             ", \"content\": " + lockstep::detail::json_quote(conv[i].content) + "}";
    out += "]";
  }
  return out + "]";
}

std::vector<TokenId> read_u32(const std::filesystem::path& file) {
  const std::string bytes = lockstep::test::read_text(file);
  std::vector<TokenId> ids(bytes.size() / 4);
  if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  return ids;
}

}  // namespace

TEST_CASE("interop: chatml and llama3 render as transformers' apply_chat_template") {
  const std::string python = lockstep::test::hf_python();
  if (python.empty()) return;
  if (lockstep::test::run_command(python + " -c 'import jinja2'").code != 0) {
    lockstep::test::skip(lockstep::test::Skip::missing,
                         "the transformers environment has no jinja2 (PyPI), which "
                         "apply_chat_template needs");
    return;
  }
  const lockstep::test::TempDir dir;
  const auto messages = dir.write("messages.json", messages_json());
  const std::string tokenizer = LOCKSTEP_SOURCE_DIR "/third_party/chat/tokenizer";
  const auto ran = lockstep::test::run_command(
      python + " \"" LOCKSTEP_SOURCE_DIR "/tests/interop/chat_template.py\" \"" + tokenizer +
      "\" \"" + messages.string() + "\" \"" + dir.path().string() + "\"");
  REQUIRE_MESSAGE(ran.code == 0, ran.output);
  const lockstep::Tokenizer tok = lockstep::Tokenizer::load(tokenizer);
  const std::vector<std::string> train_on = {"assistant"};
  for (const std::string name : {"chatml", "llama3"}) {
    for (std::size_t i = 0; i < kConversations.size(); ++i) {
      CAPTURE(i);
      const lockstep::ChatTokens ours = lockstep::render_chat(tok, name, kConversations[i], train_on);
      lockstep::test::check_same_ids(
          tok, ours.ids, read_u32(dir.path() / (name + "." + std::to_string(i) + ".u32")),
          name + ", conversation " + std::to_string(i), "apply_chat_template");
    }
  }
}
