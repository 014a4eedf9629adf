"""The paper's instruments, one copy for every product: the query checker (build and
review), the criteria writer, the judges and the policy prompts (evaluation, review and
training). A score means the same in a report, in the card and in a GRPO step."""
