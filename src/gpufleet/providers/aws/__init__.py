"""The AWS provider: ``AwsProvider`` over EC2 and EC2 Auto Scaling (boto3). See
``driver.py``; the only boto3 calls are in ``client.py``; ``docs/providers-aws.md``."""
