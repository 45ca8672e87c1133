"""Renders the expected judge prompts for the samples here, the way the authors'
gen_judgment.py does (PKU-Baichuan-MLSystemLab/FB-Bench), for Candor's snapshot tests.

usage: python3 make_expected.py JUDGE_CONFIG_V3.yaml JUDGE_CONFIG_V1.yaml
(the authors' config/judge_config.yaml at dacc09b and at 1ecdbfd).
"""
import json
import sys

import yaml


def skeleton(checklist):
    if isinstance(checklist[0], str):
        checklist = [[c, None] for c in checklist]
    d = {}
    for ckpt, weight in checklist:
        d[ckpt] = {"评判理由": "", "评判结果": "", "weight": weight}
    return json.dumps(d, indent=4, ensure_ascii=False)


def render(template, item, second_response):
    fields = dict(
        user_query=item["user_query"],
        origin_first_response=item["origin_first_response"],
        feedback=item["feedback"],
        second_response=second_response,
        checklist=item["checklist"],
        checklist_judgement=skeleton(item["checklist"]),
    )
    if "{reference_second_response}" in template:
        fields["reference_second_response"] = item["reference_second_response"]
    return template.format(**fields)


def main():
    v3 = yaml.safe_load(open(sys.argv[1]))["prompt_template_zh"]
    v1 = yaml.safe_load(open(sys.argv[2]))["prompt_template_zh"]
    for name, template in (("v3", v3), ("v1", v1)):
        items = json.load(open(f"sample_{name}.json"))
        for i, item in enumerate(items):
            with open(f"expected/judge_prompt_{name}_{i}.txt", "w") as f:
                f.write(render(template, item, f"第二轮回答 {i}"))


main()
