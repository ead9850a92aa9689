// Chat data (ChatDataset, load_chat, render_chat in lockstep/dataset.hpp): what a template
// renders and which tokens count, windows padded and packed, and bad records named by file and
// line or skipped and counted. Against transformers: tests/interop/test_chat_template.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"
#include "temp_files.hpp"

using namespace lockstep;

namespace {

// The shipped chat tokenizer: the Shakespeare BPE with both templates' special tokens.
Tokenizer chat_tokenizer() {
  return Tokenizer::load(LOCKSTEP_SOURCE_DIR "/third_party/chat/tokenizer");
}

// The text of the tokens `t` counts, and of those it does not, each run joined by '|'.
std::string counted_text(const Tokenizer& tok, const ChatTokens& t, bool counted) {
  std::string out;
  std::vector<TokenId> run;
  for (std::size_t i = 0; i <= t.ids.size(); ++i) {
    if (i < t.ids.size() && (t.counted[i] != 0) == counted) {
      run.push_back(t.ids[i]);
      continue;
    }
    if (!run.empty()) out += (out.empty() ? "" : "|") + tok.decode(run);
    run.clear();
  }
  return out;
}

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "What is 2 plus 3?"}, {"assistant", "2 plus 3 is 5."}};

}  // namespace

TEST_CASE("chat: chatml and llama3 render as their templates, and only train_on's tokens count") {
  const Tokenizer tok = chat_tokenizer();
  const std::vector<std::string> assistant = {"assistant"};
  const ChatTokens chatml = render_chat(tok, "chatml", kConversation, assistant);
  CHECK(chatml.ids == tok.encode_with_special(
                          "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 "
                          "plus 3?<|im_end|>\n<|im_start|>assistant\n2 plus 3 is 5.<|im_end|>\n"));
  CHECK(chatml.ids.size() == chatml.counted.size());
  // The assistant's content and its end of turn; not the newline after it.
  CHECK(counted_text(tok, chatml, true) == "2 plus 3 is 5.<|im_end|>");

  const ChatTokens llama = render_chat(tok, "llama3", kConversation, assistant);
  CHECK(llama.ids ==
        tok.encode_with_special(
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2 plus 3?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n2 plus 3 is 5.<|eot_id|>"));
  CHECK(counted_text(tok, llama, true) == "2 plus 3 is 5.<|eot_id|>");

  const std::vector<std::string> both = {"user", "assistant"};
  CHECK(counted_text(tok, render_chat(tok, "chatml", kConversation, both), true) ==
        "What is 2 plus 3?<|im_end|>|2 plus 3 is 5.<|im_end|>");
  CHECK_THROWS_WITH_AS(render_chat(tok, "vicuna", kConversation, assistant),
                       doctest::Contains("unknown chat template 'vicuna'"), InputError);
}

TEST_CASE("chat: a template's special tokens must be the tokenizer's") {
  const Tokenizer plain = Tokenizer::load(LOCKSTEP_SOURCE_DIR "/third_party/shakespeare/tokenizer");
  CHECK_THROWS_WITH_AS(render_chat(plain, "chatml", kConversation, {}),
                       doctest::Contains("has no special token <|im_start|>"), InputError);
}

TEST_CASE("chat: windows padded one conversation each, or packed with positions restarting") {
  // Conversations of 4, 3 and 5 ids; counted: the last two of each.
  const std::vector<ChatTokens> convs = {
      {{1, 2, 3, 4}, {0, 0, 1, 1}}, {{5, 6, 7}, {0, 1, 1}}, {{8, 9, 1, 2, 3}, {0, 0, 0, 1, 1}}};
  const ChatDataset padded(convs, /*context=*/6, /*vocab_size=*/10, /*pack=*/false);
  REQUIRE(padded.size() == 3);
  CHECK_FALSE(padded.packed());
  CHECK(padded.masks_targets());
  CHECK(padded.counted_targets() == 6);
  std::vector<float> x(6);
  std::vector<std::int32_t> y(6);
  padded.get(0, x.data(), y.data());
  CHECK(x == std::vector<float>{1, 2, 3, 0, 0, 0});
  CHECK(y == std::vector<std::int32_t>{kIgnoreLabel, 3, 4, kIgnoreLabel, kIgnoreLabel,
                                       kIgnoreLabel});

  // Packed into windows of 6 positions: 3 + 2 in the first, 4 in the second.
  const ChatDataset packed(convs, 6, 10, true);
  REQUIRE(packed.size() == 2);
  CHECK(packed.packed());
  std::vector<std::int32_t> pos(6);
  packed.get(0, x.data(), y.data());
  packed.get_positions(0, pos.data());
  CHECK(x == std::vector<float>{1, 2, 3, 5, 6, 0});
  CHECK(y == std::vector<std::int32_t>{kIgnoreLabel, 3, 4, 6, 7, kIgnoreLabel});
  CHECK(pos == std::vector<std::int32_t>{0, 1, 2, 0, 1, 0});
  packed.get(1, x.data(), y.data());
  packed.get_positions(1, pos.data());
  CHECK(x == std::vector<float>{8, 9, 1, 2, 0, 0});
  CHECK(pos == std::vector<std::int32_t>{0, 1, 2, 3, 0, 1});
  CHECK(packed.counted_targets() == padded.counted_targets());
}

TEST_CASE("chat: bad records name the file and line, or are skipped and counted") {
  const test::TempDir dir;
  const Tokenizer tok = chat_tokenizer();
  const ChatOptions options{.context = 64};
  const std::string good = R"({"prompt": "Hi.", "response": "Hello."})";
  const std::string long_one =
      R"({"messages": [{"role": "user", "content": ")" + std::string(400, 'x') + R"("}]})";
  struct Case {
    std::string line, message;
  };
  const Case cases[] = {
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "unknown role 'wizard'"},
      {R"({"text": "no messages"})", "no \"messages\""},
      {R"({"messages": [{"role": "user"}]})", "messages[0]: no \"content\""},
      {R"({"messages": [)", "invalid JSON"},
      {R"({"prompt": "only a prompt"})", "no \"response\""},
      {long_one, "does not fit the window"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.line);
    const auto file = dir.write("chat.jsonl", good + "\n\n" + c.line + "\n" + good + "\n");
    CHECK_THROWS_WITH_AS(load_chat(file, tok, 2048, options),
                         doctest::Contains((file.string() + ":3: ").c_str()), InputError);
    CHECK_THROWS_WITH_AS(load_chat(file, tok, 2048, options), doctest::Contains(c.message.c_str()),
                         InputError);
    ChatOptions skip = options;
    skip.skip_bad_records = true;
    const ChatSplit split = load_chat(file, tok, 2048, skip);
    CHECK(split.train->conversations() == 2);
    CHECK(split.train->skipped() == 1);
  }
}
